//! The OpenAPI 3.1 document served at `/openapi.json`, generated (utoipa) from the
//! types the handlers read and write, so the two cannot drift:
//! - generated: every request and response schema of the lock service, the store, the
//!   cluster and the operations endpoints (fields, types, required, nullable, unknown
//!   fields refused), the events' shapes, and the paths of those calls, from the
//!   `#[utoipa::path]` beside each handler (methods, parameters, status codes);
//! - from the configuration, at start: the bounds a client can hit (TTL range, wait,
//!   lock-delay, name and key lengths, list limit, value size) and whether
//!   `Fencing-Token` is required on a PUT (it is, unless `unfenced_prefix` is set), so
//!   the document describes this server, not the defaults;
//! - generated in `fenced-console` (`fenced_console::openapi`), merged here: the web
//!   console's pages and the laboratory's API, from the request types it parses and the
//!   limits its routes run with.

use serde_json::{json, Value};
use utoipa::OpenApi;

use super::{leases, locks, ops, store};
use crate::config::Config;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Fenced",
        description = "A lock service whose every grant carries a strictly increasing fencing token, \
            and a key-value store that refuses stale tokens. Every error is \
            {\"error\":{\"code\",\"message\",...details}}. With auth_token_file, /v1 calls need \
            'Authorization: Bearer <token>' (else 401 unauthorized)."
    ),
    paths(
        leases::create,
        leases::keepalive,
        leases::revoke,
        locks::paths::doc_acquire,
        locks::paths::doc_acquire_all,
        locks::paths::doc_release,
        locks::paths::doc_check,
        locks::paths::doc_revoke_lock,
        locks::get_one,
        locks::list,
        store::list,
        store::write,
        store::read,
        ops::events,
        ops::cluster,
        ops::keys,
        ops::add_member,
        ops::remove_member,
        ops::snapshot,
        ops::metrics,
        ops::livez,
        ops::readyz,
        ops::openapi,
    ),
    components(schemas(super::error::ErrorBody, ops::EventData))
)]
struct ApiDoc;

/// The document for a server with `config`, as JSON.
pub fn document(config: &Config) -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    // The console's routes are served with the defaults `fenced_console::api()` has, so
    // they are described with those (`fenced_console::openapi()`).
    let console = fenced_console::openapi();
    for part in ["paths", "components/schemas"] {
        let from = console.pointer(&format!("/{part}")).and_then(Value::as_object).expect("the console's document");
        let into = doc.pointer_mut(&format!("/{part}")).and_then(Value::as_object_mut).expect("the document");
        for (k, v) in from {
            assert!(into.insert(k.clone(), v.clone()).is_none(), "{part}/{k} is described twice");
        }
    }
    if let Some(paths) = doc["paths"].as_object_mut() {
        paths.sort_keys();
    }
    apply_limits(&mut doc, config);
    serde_json::to_string_pretty(&doc).expect("the document serializes")
}

/// Writes this configuration's bounds into the generated schemas and parameters.
fn apply_limits(doc: &mut Value, c: &Config) {
    let ttl = json!({ "minimum": c.ttl_ms_min, "maximum": c.ttl_ms_max });
    let wait = json!({ "minimum": 0, "maximum": c.wait_ms_max });
    let delay = json!({ "minimum": 0, "maximum": c.lock_delay_ms_max });
    let schemas = "/components/schemas";
    merge(doc, &format!("{schemas}/LeaseRequest/properties/ttl_ms"), &ttl);
    // lease_id (an existing lease), ttl_ms (an implicit lease), or both (an implicit
    // lease whose id the caller chose), each non-null when given.
    let one_of = json!({ "oneOf": [
        { "required": ["lease_id"], "properties": { "lease_id": { "type": "string" }, "ttl_ms": { "type": "null" } } },
        { "required": ["ttl_ms"], "properties": { "ttl_ms": { "type": "integer" }, "lease_id": { "type": "null" } } },
        { "required": ["lease_id", "ttl_ms"], "properties": { "lease_id": { "type": "string" }, "ttl_ms": { "type": "integer" } } },
    ] });
    // One lock or several: the same bounds, the same choice of lease.
    for acquire in ["AcquireRequest", "AcquireAllRequest"] {
        merge(doc, &format!("{schemas}/{acquire}/properties/wait_ms"), &wait);
        merge(doc, &format!("{schemas}/{acquire}/properties/lock_delay_ms"), &delay);
        // ttl_ms is nullable there (null: absent); the bounds apply to a number only.
        merge(doc, &format!("{schemas}/{acquire}/properties/ttl_ms"), &ttl);
        merge(doc, &format!("{schemas}/{acquire}"), &one_of);
        // A holder label is checked as a name is: bytes, and no control character.
        let holder = &format!("{schemas}/{acquire}/properties/holder");
        let said = doc.pointer(holder).and_then(|h| h["description"].as_str()).unwrap_or_default().to_string();
        let max = fenced_core::HOLDER_BYTES_MAX;
        let note = format!(
            "1 to {max} bytes of UTF-8 without control characters (maxLength counts characters: a label of \
             multi-byte characters may be refused below it, 400 invalid_holder)"
        );
        let description = if said.is_empty() { note } else { format!("{said}\n{note}") };
        merge(doc, holder, &json!({ "pattern": NO_CONTROL, "description": description }));
    }
    // Each name of an acquire of several is a lock name, as in a lock's path.
    let each = json!({
        "minLength": 1,
        "maxLength": c.lock_name_bytes_max,
        "pattern": NO_CONTROL,
        "description": format!("a lock name, as in a lock's path. {}", bytes_note(c.lock_name_bytes_max as u64, "/v1/locks")),
    });
    merge(doc, &format!("{schemas}/AcquireAllRequest/properties/names/items"), &each);
    let name = json!({ "maxLength": c.lock_name_bytes_max, "pattern": NO_CONTROL });
    let key = json!({ "maxLength": c.store_key_bytes_max, "pattern": NO_CONTROL });
    let (name_prefix, key_prefix) =
        (json!({ "maxLength": c.lock_name_bytes_max }), json!({ "maxLength": c.store_key_bytes_max }));
    let limit = json!({ "maximum": c.list_locks_max });
    let Some(paths) = doc["paths"].as_object_mut() else { return };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for op in item.values_mut() {
            let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else { continue };
            for p in params {
                let bound = match (p["name"].as_str(), p["in"].as_str()) {
                    // A header is a string on the wire, never null: absent is the
                    // parameter's `required: false` (a `Fencing-Token: null` is 400).
                    (Some(_), Some("header")) => {
                        not_null(&mut p["schema"]);
                        continue;
                    }
                    (Some("limit"), Some("query")) => {
                        merge_value(&mut p["schema"], &limit);
                        continue;
                    }
                    (Some("name"), Some("path")) if path.starts_with("/v1/locks") => Some(&name),
                    (Some("key"), Some("path")) if path.starts_with("/v1/store") => Some(&key),
                    // A prefix may be empty: its length only.
                    (Some("prefix"), Some("query")) if path == "/v1/locks" => Some(&name_prefix),
                    (Some("prefix"), Some("query")) if path == "/v1/store" => Some(&key_prefix),
                    _ => None,
                };
                if let Some(bound) = bound {
                    merge_value(&mut p["schema"], bound);
                    let bytes = bound["maxLength"].as_u64().expect("a length bound");
                    let said = p["description"].as_str().unwrap_or_default().to_string();
                    p["description"] = json!(format!("{said}. {}", bytes_note(bytes, path)));
                }
            }
        }
    }
    // A fenced write needs its token (428 token_required), unless some keys take
    // writes without one.
    if c.unfenced_prefix.is_empty() {
        let put = doc.pointer_mut("/paths/~1v1~1store~1{key}/put/parameters").and_then(Value::as_array_mut);
        for p in put.into_iter().flatten().filter(|p| p["name"] == "Fencing-Token") {
            p["required"] = json!(true);
            p["schema"] = json!({ "type": "integer", "format": "uint64", "minimum": 1 });
        }
    }
    // A body the server takes as "empty, or {}" (`Option<T>` in the handler's
    // description) has no JSON null: the server reads `null` as a body that does not
    // fit (400 invalid_field); no body at all is the requestBody's `required: false`.
    let paths = doc["paths"].as_object_mut().into_iter().flatten();
    for (path, item) in paths.filter(|(path, _)| !path.starts_with("/v1/sim")) {
        let Some(item) = item.as_object_mut() else { continue };
        for op in item.values_mut() {
            let Some(schema) = op.pointer_mut("/requestBody/content/application~1json/schema") else { continue };
            let Some(one_of) = schema.get("oneOf").and_then(Value::as_array) else { continue };
            let null = one_of.iter().position(|v| *v == json!({ "type": "null" }));
            if let (Some(at), 2) = (null, one_of.len()) {
                *schema = one_of[1 - at].clone();
                assert_ne!(op["requestBody"]["required"], true, "{path}: a required body that may be null");
            }
        }
    }
    bound_unsigned(doc);
}

/// `["integer", "null"]` (an `Option` in the handler's types) as `"integer"`.
fn not_null(schema: &mut Value) {
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        schema["type"] = if kept.len() == 1 { kept[0].clone() } else { Value::Array(kept) };
    }
}

/// Every u64 the API reads is taken up to 2^64 - 1: say so, or a fuzzer would take an
/// int64 for the truth. (utoipa spells the format `u-int64`; the registry of formats
/// says `uint64`.) A value in a body of `application/octet-stream` is bytes, not the
/// array of integers a `Vec<u8>` would be described as.
fn bound_unsigned(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if o.get("format").and_then(Value::as_str) == Some("u-int64") {
                o.insert("format".into(), json!("uint64"));
            }
            if o.get("format").and_then(Value::as_str) == Some("uint64") && !o.contains_key("maximum") {
                o.insert("maximum".into(), json!(u64::MAX));
            }
            if let Some(bytes) = o.get_mut("application/octet-stream") {
                bytes["schema"] = json!({ "type": "string", "format": "binary" });
            }
            o.values_mut().for_each(bound_unsigned);
        }
        Value::Array(a) => a.iter_mut().for_each(bound_unsigned),
        _ => {}
    }
}

/// What a length bound in bytes means for a client that counts characters.
fn bytes_note(bytes: u64, path: &str) -> String {
    let (what, code) = if path.starts_with("/v1/store") { ("key", "invalid_key") } else { ("name", "invalid_name") };
    format!(
        "At most {bytes} bytes of UTF-8: maxLength counts characters, so it is {bytes} too (no {what} the server \
         takes is longer), and a {what} of multi-byte characters may be refused below it (400 {code}, or \
         invalid_query for a prefix)"
    )
}

/// A name or key: no control character (C0, DEL, C1). Its length bound counts bytes on
/// the server and characters in JSON Schema: a name of non-ASCII characters may be
/// refused below `maxLength` (JSON Schema cannot count UTF-8 bytes).
const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";

fn merge(doc: &mut Value, pointer: &str, with: &Value) {
    let target = doc.pointer_mut(pointer).unwrap_or_else(|| panic!("the generated document has no {pointer}"));
    merge_value(target, with);
}

fn merge_value(target: &mut Value, with: &Value) {
    if let (Some(t), Some(w)) = (target.as_object_mut(), with.as_object()) {
        for (k, v) in w {
            t.insert(k.clone(), v.clone());
        }
    }
}
