// Whether the server speaks the API this client speaks, read once per client from its
// `/openapi.json` (generated from the server's handlers, so it cannot drift from them).

import { Answer } from "./http.js";
import { IncompatibleServerError, errorFromAnswer, isObject } from "./errors.js";

/** The calls this client makes, as the document names them (path parameters as `{}`). */
export const REQUIRED_OPERATIONS: readonly (readonly [string, string])[] = [
  ["post", "/v1/leases"],
  ["post", "/v1/leases/{}/keepalive"],
  ["delete", "/v1/leases/{}"],
  ["post", "/v1/locks/{}/acquire"],
  ["post", "/v1/locks/{}/check"],
  ["get", "/v1/locks/{}"],
  ["put", "/v1/store/{}"],
  ["get", "/v1/store/{}"],
  ["get", "/readyz"],
];

/** What the client learnt of the server. */
export interface ServerApi {
  /** `info.title`: "Fenced". */
  title: string;
  /** `info.version`: the server's version. */
  version: string;
  /** Whether an acquire takes a `holder` label (`holder` in the document's `AcquireRequest`; servers before it do not). */
  acceptsHolder: boolean;
  /** Whether it takes an operator's revoke of a lock (`POST /v1/locks/{name}/revoke`; servers before it do not). */
  revokesLocks: boolean;
  /** Whether it serves the event stream (`GET /v1/events`; servers before it do not). */
  servesEvents: boolean;
}

/**
 * Reads the document: an OpenAPI 3.x document titled "Fenced" that has every call
 * above, and whose acquire takes `lease_id` together with `ttl_ms` (an implicit lease
 * the caller names, which the client's retries rely on). Throws
 * `IncompatibleServerError` saying what is missing.
 */
export function readServerApi(a: Answer, url: string): ServerApi {
  const refuse = (why: string): never => {
    throw new IncompatibleServerError("incompatible_server", `${url} does not speak the Fenced HTTP API v1 this client speaks: ${why}`, a.status);
  };
  // A member that cannot answer now (5xx, 429, 408) or a proxy's refusal is not a verdict on its API.
  if (a.status >= 500 || [401, 403, 408, 429].includes(a.status)) throw errorFromAnswer(a.status, a.body, `reading ${url}/openapi.json`);
  if (a.status !== 200) refuse(`GET /openapi.json answered ${a.status}, not the API document`);
  let doc: unknown;
  try {
    doc = JSON.parse(a.body.toString("utf8"));
  } catch {
    return refuse("/openapi.json is not JSON");
  }
  if (!isObject(doc)) return refuse("/openapi.json is not a JSON object");
  if (typeof doc.openapi !== "string" || !doc.openapi.startsWith("3.")) refuse(`the document is not OpenAPI 3 (openapi: ${JSON.stringify(doc.openapi)})`);
  const info = isObject(doc.info) ? doc.info : {};
  if (info.title !== "Fenced") refuse(`the document's title is ${JSON.stringify(info.title)}, not "Fenced"`);
  const paths = isObject(doc.paths) ? doc.paths : {};
  const have = new Set<string>();
  for (const [p, item] of Object.entries(paths)) {
    if (!isObject(item)) continue;
    for (const m of Object.keys(item)) have.add(`${m.toLowerCase()} ${p.replace(/\{[^}]*\}/g, "{}")}`);
  }
  const missing = REQUIRED_OPERATIONS.filter(([m, p]) => !have.has(`${m} ${p}`)).map(([m, p]) => `${m.toUpperCase()} ${p}`);
  if (missing.length > 0) refuse(`it lacks ${missing.join(", ")}`);
  const schemas = isObject(doc.components) && isObject(doc.components.schemas) ? doc.components.schemas : {};
  const acquire = isObject(schemas.AcquireRequest) ? schemas.AcquireRequest : undefined;
  const props = acquire && isObject(acquire.properties) ? acquire.properties : {};
  const branches = acquire && Array.isArray(acquire.oneOf) ? acquire.oneOf : [];
  const named = branches.some((b) => isObject(b) && Array.isArray(b.required) && b.required.includes("lease_id") && b.required.includes("ttl_ms"));
  if (!("lease_id" in props) || !("ttl_ms" in props) || !("wait_ms" in props) || !named) {
    refuse("its acquire does not take an implicit lease named by the caller ({\"lease_id\",\"ttl_ms\",\"wait_ms\"}), which this client's retries need");
  }
  return {
    title: "Fenced",
    version: typeof info.version === "string" ? info.version : "unknown",
    acceptsHolder: "holder" in props,
    revokesLocks: have.has("post /v1/locks/{}/revoke"),
    servesEvents: have.has("get /v1/events"),
  };
}
