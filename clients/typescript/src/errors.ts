// The client's typed errors, and the one place an error answer of the API
// (`{"error":{"code","message",...details}}`) is given a class.

/** The error's details as the server sent them (the fields beside `code` and `message`). */
export type Details = Record<string, unknown>;

/** Why a lock stopped being trustworthy. */
export type LostReason =
  /** No acquire or keepalive succeeded before the client-side deadline (`validUntil`). */
  | "expired"
  /** A keepalive came back, but after the client-side deadline. */
  | "keepalive_too_late"
  /** The server no longer knows the lease: it expired there or was revoked. */
  | "lease_not_found"
  /** The server refused the keepalive's credentials (401 or 403). */
  | "unauthorized";

const LOST_MESSAGES: Record<LostReason, string> = {
  expired: "no keepalive succeeded before the lease's client-side deadline",
  keepalive_too_late: "a keepalive came back after the client-side deadline",
  lease_not_found: "the server no longer knows the lease (expired or revoked)",
  unauthorized: "the server refused the keepalive's credentials",
};

/**
 * Every error this library throws. `code` is the server's snake_case code when the
 * server answered (`lock_held`, `stale_token`, ...), or one of the client's own
 * (`unreachable`, `timeout`, `connection_lost`, `lock_lost`, `incompatible_server`,
 * `bad_response`, `bad_argument`, `lagged`, `position_unknown`); `status` is the HTTP status when there was one.
 */
export class FencedError extends Error {
  readonly code: string;
  readonly status: number | undefined;
  readonly details: Details;

  constructor(code: string, message: string, status?: number, details: Details = {}, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
    this.status = status;
    this.details = details;
    this.name = new.target.name;
  }
}

/** The request was malformed or out of a limit (400, 405, 413, 414, 415, 431), or refused here before sending. */
export class BadRequestError extends FencedError {}

/** The auth token was missing or wrong (401 `unauthorized`). */
export class UnauthorizedError extends FencedError {}

/** The credentials do not allow this call (403 `forbidden`). */
export class ForbiddenError extends FencedError {}

/** The lock is another's: the base of `LockHeldError` and `NotHolderError`. */
export class HeldByAnotherError extends FencedError {
  /** The current holder's token, when the lock is held (not during a lock-delay). */
  get holderToken(): number | undefined {
    return num(this.details.holder_token);
  }
}

/** The lock was not granted within the wait (409 `lock_held`). */
export class LockHeldError extends HeldByAnotherError {}

/** A release by a lease that does not hold the lock (409 `not_holder`). */
export class NotHolderError extends HeldByAnotherError {}

/** The lease is gone: expired or revoked (404 `lease_not_found`). */
export class LeaseNotFoundError extends FencedError {}

/** An implicit lease's id names a live lease that is not this call's (409 `lease_exists`). */
export class LeaseExistsError extends FencedError {}

/** Something asked for does not exist (404 `not_found`). */
export class NotFoundError extends FencedError {}

/**
 * A token refused, and nothing done: the base of `StaleTokenError`, `TokenNotIssuedError`
 * and `BadSignatureError`.
 */
export class TokenRefusedError extends FencedError {
  /** The token the operation carried. */
  get token(): number {
    return num(this.details.token) ?? 0;
  }
}

/** The resource has seen a newer token: the operation was refused and changed nothing (409 `stale_token`). */
export class StaleTokenError extends TokenRefusedError {
  /** The resource's mark, above `token`. */
  get highestSeen(): number {
    return num(this.details.highest_seen) ?? 0;
  }
}

/** A token above every token the service has issued (409 `token_not_issued`). */
export class TokenNotIssuedError extends TokenRefusedError {
  /** The highest token issued so far, when the server said. */
  get highestIssued(): number | undefined {
    return num(this.details.highest_issued);
  }
}

/**
 * A gate given the service's verifying keys refused a token without a valid signature
 * for the lock that guards the resource (a forged number, another lock's token, another
 * service's): the server's store for a key under `signed_key_prefix` (403
 * `bad_signature`, 428 `signature_required`), or a `Verified` gate. Nothing was done.
 */
export class BadSignatureError extends TokenRefusedError {
  /** The lock whose signature the gate asked for. */
  get lock(): string {
    return typeof this.details.lock === "string" ? this.details.lock : "";
  }
}

/** A write to a fenced key without a token (428 `token_required`). */
export class TokenRequiredError extends FencedError {}

/** A store quota or the disk reserve refused a write (507 `store_full`, `insufficient_storage`). */
export class StorageFullError extends FencedError {}

/**
 * The service cannot serve this now: unreachable, timed out, the connection broke,
 * no member leads, or it refused for load (429, 503, 408). `retryAfterMs` is the
 * server's hint when it gave one.
 */
export class UnavailableError extends FencedError {
  get retryAfterMs(): number | undefined {
    return num(this.details.retry_after_ms);
  }
}

/** The member answered that it is not the leader (503 `not_leader`); `leaderId` when it knows one. */
export class NotLeaderError extends UnavailableError {
  get leaderId(): number | undefined {
    return num(this.details.leader_id);
  }
}

/** The member is shutting down (503 `shutting_down`). */
export class ShuttingDownError extends UnavailableError {}

/** A grace after a data-directory migration (503 `recovering`, with `retryAfterMs`). */
export class RecoveringError extends UnavailableError {}

/** A server-side bound on leases, locks or waiters (429 `too_many_*`), with `limit`. */
export class LimitExceededError extends UnavailableError {
  get limit(): number | undefined {
    return num(this.details.limit);
  }
}

/** The lock was lost, or can no longer be trusted, before the work finished. */
export class LockLostError extends FencedError {
  readonly reason: LostReason;
  constructor(reason: LostReason, name: string) {
    super("lock_lost", `lock '${name}' lost: ${LOST_MESSAGES[reason]}`, undefined, { reason });
    this.reason = reason;
  }
}

/**
 * A watch cannot go on without a gap, so it stops rather than skip events: the events
 * after its position are no longer held (410 `compacted`; `oldestIndex` is the oldest
 * index the member holds), its stream fell behind what the member holds (`lagged`), or
 * its stream broke before the server told where it started (`position_unknown`). Read
 * the state again (`client.locks(prefix)`) and start a new watch.
 */
export class MissedEventsError extends FencedError {
  /** The oldest index the member still holds, when it said (a watch from `oldestIndex - 1` resumes there). */
  get oldestIndex(): number | undefined {
    return num(this.details.oldest_index);
  }
}

/** A cluster membership change did not complete (409 `membership_change_failed`). */
export class MembershipChangeError extends FencedError {}

/** The server does not speak the API this client speaks (see `Client`). */
export class IncompatibleServerError extends FencedError {}

/** The server answered something this client cannot read. */
export class BadResponseError extends FencedError {}

type ErrorClass = new (code: string, message: string, status?: number, details?: Details) => FencedError;

/**
 * The class of every code the API answers (docs/server.md), by code. A code missing
 * here falls back to its status class (`classForStatus`), then to `FencedError`.
 */
export const ERROR_CLASSES: Readonly<Record<string, ErrorClass>> = {
  // 400: bad input
  invalid_json: BadRequestError,
  invalid_field: BadRequestError,
  invalid_name: BadRequestError,
  invalid_holder: BadRequestError,
  invalid_lease_id: BadRequestError,
  invalid_token: BadRequestError,
  invalid_key: BadRequestError,
  invalid_query: BadRequestError,
  invalid_request: BadRequestError,
  invalid_body: BadRequestError,
  malformed_request: BadRequestError,
  missing_host: BadRequestError,
  unfenced_key: BadRequestError,
  ttl_out_of_range: BadRequestError,
  wait_out_of_range: BadRequestError,
  lock_delay_out_of_range: BadRequestError,
  bad_parameter: BadRequestError,
  bad_preamble: BadRequestError,
  unknown_op: BadRequestError,
  invalid_frame: BadRequestError,
  invalid_upgrade: BadRequestError,
  method_not_allowed: BadRequestError,
  unsupported_media_type: BadRequestError,
  invalid_names: BadRequestError,
  too_large: BadRequestError,
  trace_too_large: BadRequestError,
  uri_too_long: BadRequestError,
  headers_too_large: BadRequestError,
  // 401, 403
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  // peer routes refused: not a client's business, typed all the same
  not_a_cluster: ForbiddenError,
  invalid_snapshot: BadRequestError,
  snapshot_not_resumable: BadRequestError,
  // 404
  lease_not_found: LeaseNotFoundError,
  not_found: NotFoundError,
  not_signing: NotFoundError,
  // 409
  lock_held: LockHeldError,
  not_holder: NotHolderError,
  lease_exists: LeaseExistsError,
  stale_token: StaleTokenError,
  token_not_issued: TokenNotIssuedError,
  bad_signature: BadSignatureError,
  signature_required: BadSignatureError,
  membership_change_failed: MembershipChangeError,
  // 410: a watch's resume point is no longer held
  compacted: MissedEventsError,
  // 500: a backup the server could not make
  snapshot_failed: FencedError,
  // 428
  token_required: TokenRequiredError,
  // 429
  too_many_leases: LimitExceededError,
  too_many_locks: LimitExceededError,
  too_many_waiters: LimitExceededError,
  // 408, 503
  body_timeout: UnavailableError,
  not_leader: NotLeaderError,
  no_leader: UnavailableError,
  shutting_down: ShuttingDownError,
  recovering: RecoveringError,
  too_busy: UnavailableError,
  too_many_connections: UnavailableError,
  sim_busy: UnavailableError,
  sim_timeout: UnavailableError,
  // 507
  store_full: StorageFullError,
  insufficient_storage: StorageFullError,
};

function classForStatus(status: number | undefined): ErrorClass {
  switch (status) {
    case 400:
    case 405:
    case 413:
    case 414:
    case 415:
    case 422:
    case 431:
      return BadRequestError;
    case 401:
      return UnauthorizedError;
    case 403:
      return ForbiddenError;
    case 404:
      return NotFoundError;
    case 408:
    case 429:
    case 502:
    case 503:
    case 504:
      return UnavailableError;
    case 507:
      return StorageFullError;
    default:
      return FencedError;
  }
}

/**
 * The typed error for an error answer: `body` is the raw answer, parsed as
 * `{"error":{"code","message",...details}}`; anything else keeps its first 200
 * characters as the message, under the code `http_<status>`.
 */
export function errorFromAnswer(status: number, body: Buffer | string, what: string): FencedError {
  const text = typeof body === "string" ? body : body.toString("utf8");
  let code = `http_${status}`;
  let message = text.slice(0, 200);
  let details: Details = {};
  try {
    const parsed: unknown = JSON.parse(text);
    const inner = isObject(parsed) ? parsed.error : undefined;
    if (isObject(inner) && typeof inner.code === "string") {
      const { code: c, message: m, ...rest } = inner;
      code = c;
      message = typeof m === "string" && m !== "" ? m : c;
      details = rest;
    }
  } catch {
    // not JSON: keep the raw text
  }
  const Class = ERROR_CLASSES[code] ?? classForStatus(status);
  return new Class(code, `${what}: ${message} (${status} ${code})`, status, details);
}

/** A client-side refusal, before anything was sent. */
export function badArgument(message: string): BadRequestError {
  return new BadRequestError("bad_argument", message);
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}
