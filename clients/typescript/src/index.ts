// @fenced/client: locks whose every grant carries a strictly increasing fencing token,
// with an honest lost-lock signal, and the fenced store that refuses stale tokens.

export { Client, ENDPOINT_DEFAULT, Store, newLeaseId, parseDurationMs } from "./client.js";
export type { ClientOptions, LockContext, LockOptions } from "./client.js";
export { Lock, validUntil, defaultMargin } from "./lock.js";
export { GrantKeys, Verified, grantMessage, storeGate } from "./signing.js";
export type { FencedGate, LockOf } from "./signing.js";
export type { GetResult, PutResult } from "./calls.js";
export { Watch, WATCH_RETRY_FOR_MS, WATCH_SILENCE_MS } from "./watch.js";
export type { ExpiredEvent, GrantedEvent, OtherEvent, ReleasedEvent, StoreAcceptedEvent, StoreRejectedEvent, WatchEvent, WatchOptions } from "./watch.js";
export type { ServerApi } from "./compat.js";
export { ATTEMPT_TIMEOUT_DEFAULT_MS, ATTEMPT_TIMEOUT_MIN_MS } from "./failover.js";
export {
  BadRequestError,
  BadResponseError,
  BadSignatureError,
  ERROR_CLASSES,
  FencedError,
  ForbiddenError,
  HeldByAnotherError,
  IncompatibleServerError,
  LeaseExistsError,
  LeaseNotFoundError,
  LimitExceededError,
  LockHeldError,
  LockLostError,
  MembershipChangeError,
  MissedEventsError,
  NotFoundError,
  NotHolderError,
  NotLeaderError,
  RecoveringError,
  ShuttingDownError,
  StaleTokenError,
  StorageFullError,
  TokenNotIssuedError,
  TokenRefusedError,
  TokenRequiredError,
  UnauthorizedError,
  UnavailableError,
  errorFromAnswer,
} from "./errors.js";
export type { Details, LostReason } from "./errors.js";
