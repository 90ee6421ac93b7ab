// The API document of a Fenced server, for the tests of the client's check of it and
// for fake servers that must pass that check.

/** What a document lists beyond the routes every client call needs. */
export interface ApiDocOptions {
  /** `info.version`. */
  version?: string;
  /** `POST /v1/locks/{name}/revoke`. */
  revoke?: boolean;
  /** `GET /v1/events`. */
  events?: boolean;
}

/** A document that passes the client's check: Fenced's title, API v1's routes and the caller-named implicit lease. */
export function apiDoc({ version = "0.1.0", revoke = false, events = false }: ApiDocOptions = {}): Record<string, unknown> {
  const op = { responses: {} };
  const paths: Record<string, unknown> = {
    "/v1/leases": { post: op },
    "/v1/leases/{lease_id}": { delete: op },
    "/v1/leases/{lease_id}/keepalive": { post: op },
    "/v1/locks/{name}": { get: op },
    "/v1/locks/{name}/acquire": { post: op },
    "/v1/locks/{name}/release": { post: op },
    ...(revoke ? { "/v1/locks/{name}/revoke": { post: op } } : {}),
    "/v1/locks/{name}/check": { post: op },
    "/v1/store/{key}": { get: op, put: op },
    ...(events ? { "/v1/events": { get: op } } : {}),
    "/readyz": { get: op },
  };
  const acquire = {
    properties: { lease_id: {}, ttl_ms: {}, wait_ms: {} },
    oneOf: [{ required: ["lease_id"] }, { required: ["ttl_ms"] }, { required: ["lease_id", "ttl_ms"] }],
  };
  return { openapi: "3.1.0", info: { title: "Fenced", version }, paths, components: { schemas: { AcquireRequest: acquire } } };
}
