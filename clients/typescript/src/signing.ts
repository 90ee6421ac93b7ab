// Verifying signed grants offline.
//
// With `grant_signing_key` the service signs every grant: an Ed25519 signature over
// "fenced-grant-v1\0" + its identity (`grant_service`) + "\0" + the lock's name + "\0"
// + the token as 8 big-endian bytes. A resource given the verifying keys (`GrantKeys`,
// from `GET /v1/keys` once, or from configuration) tells a token the service issued for
// the lock that guards it from a forged number or another lock's token, without asking
// the service. A signature proves the service issued that token for that lock; it does
// not prove the holder still holds it: the resource's mark does that, so a gate checks
// both (`Verified`). Node's own crypto verifies; nothing to install.

import { KeyObject, createPublicKey, verify } from "node:crypto";

import type { Store } from "./client.js";
import { BadRequestError, BadSignatureError } from "./errors.js";

/** What the service signs for `token` of `lock`. */
export function grantMessage(service: string, lock: string, token: number | bigint): Buffer {
  const t = Buffer.alloc(8);
  t.writeBigUInt64BE(BigInt(token));
  return Buffer.concat([Buffer.from("fenced-grant-v1\0"), Buffer.from(service), Buffer.from([0]), Buffer.from(lock), Buffer.from([0]), t]);
}

interface Key {
  key: KeyObject;
  /** Unix seconds after which it no longer verifies; undefined: while published. */
  untilUnix: number | undefined;
}

function publicKey(hex: unknown): KeyObject {
  if (typeof hex !== "string" || !/^[0-9a-fA-F]{64}$/.test(hex)) {
    throw new BadRequestError("invalid_key", `${JSON.stringify(hex)} is not an Ed25519 public key (64 hex digits)`);
  }
  const x = Buffer.from(hex, "hex").toString("base64url");
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" });
}

/** The keys that verify one service's grant signatures. */
export class GrantKeys {
  readonly service: string;
  readonly #keys: Key[];

  /** `keys`: Ed25519 public keys as 64 hex digits (`GET /v1/keys`'s `public_key`). */
  constructor(service: string, keys: readonly string[]) {
    if (typeof service !== "string" || service === "" || !Array.isArray(keys) || keys.length === 0) {
      throw new BadRequestError("invalid_keys", "grant keys need a service and at least one key");
    }
    this.service = service;
    this.#keys = keys.map((k) => ({ key: publicKey(k), untilUnix: undefined }));
  }

  /** The body of `GET /v1/keys`; a retired key verifies until its `valid_until_unix`. */
  static fromJson(doc: Record<string, unknown>): GrantKeys {
    const keys = doc?.keys;
    if (!Array.isArray(keys)) throw new BadRequestError("invalid_keys", `not a /v1/keys document: ${JSON.stringify(doc).slice(0, 200)}`);
    for (const k of keys as Record<string, unknown>[]) {
      if (k?.algorithm !== "ed25519") throw new BadRequestError("invalid_keys", `a key that is not ed25519: ${JSON.stringify(k)}`);
    }
    const out = new GrantKeys(String(doc.service ?? ""), keys.map((k: Record<string, unknown>) => k.public_key as string));
    keys.forEach((k: Record<string, unknown>, i) => {
      const key = out.#keys[i] as Key;
      key.untilUnix = typeof k.valid_until_unix === "number" ? k.valid_until_unix : undefined;
    });
    return out;
  }

  /** Whether `signature` (hex) is the service's for `token` of `lock`, by a key that verifies now. */
  verifies(lock: string, token: number, signature: string | undefined): boolean {
    if (typeof signature !== "string" || !/^[0-9a-fA-F]{128}$/.test(signature)) return false;
    if (!Number.isSafeInteger(token) || token < 1) return false;
    const message = grantMessage(this.service, lock, token);
    const sig = Buffer.from(signature, "hex");
    const now = Date.now() / 1000;
    return this.#keys.some((k) => (k.untilUnix === undefined || k.untilUnix > now) && verify(null, message, k.key, sig));
  }

  /** `verifies` as a refusal: `BadSignatureError` (`token`, `lock`). */
  check(lock: string, token: number, signature: string | undefined): void {
    if (!this.verifies(lock, token, signature)) {
      throw new BadSignatureError("bad_signature", `token ${token} carries no valid signature of service '${this.service}' for lock '${lock}'`, undefined, { token, lock });
    }
  }
}

/** A fence gate: a write and a fenced read under a token (the store's, or your resource's). */
export interface FencedGate {
  write(key: string, value: Uint8Array, token: number): Promise<unknown>;
  read(key: string, token: number): Promise<Uint8Array | null>;
}

/** The server's built-in store as a `FencedGate`. */
export function storeGate(store: Store): FencedGate {
  return {
    write: (key, value, token) => store.put(key, value, { token }),
    read: async (key, token) => (await store.get(key, { token }))?.value ?? null,
  };
}

/** The lock that guards a key: one name for every key, or a function of the key. */
export type LockOf = string | ((key: string) => string);

/**
 * A gate behind the check of the service's signature: given the verifying keys and the
 * lock that guards each key (default: the lock of the key's own name), a token without
 * a valid signature for that lock throws `BadSignatureError` before the resource is
 * touched; a signed one goes on to the inner gate, whose mark refuses it if it is
 * stale. So a forged number and a real token of another lock (higher, since every lock
 * draws from one counter) are both refused.
 */
export class Verified {
  readonly gate: FencedGate;
  readonly keys: GrantKeys;
  readonly #lockOf: (key: string) => string;

  constructor(gate: FencedGate, keys: GrantKeys, lock?: LockOf) {
    if (!(keys instanceof GrantKeys)) throw new TypeError("keys is a GrantKeys (client.grantKeys(), or new GrantKeys(service, [hex]))");
    this.gate = gate;
    this.keys = keys;
    this.#lockOf = lock === undefined ? (k) => k : typeof lock === "string" ? () => lock : lock;
  }

  async write(key: string, value: Uint8Array | string, options: { token: number; signature?: string }): Promise<void> {
    this.keys.check(this.#lockOf(key), options.token, options.signature);
    await this.gate.write(key, typeof value === "string" ? Buffer.from(value) : value, options.token);
  }

  /** A fenced read (it moves the mark), if the token is signed for the key's lock. */
  async read(key: string, options: { token: number; signature?: string }): Promise<Uint8Array | null> {
    this.keys.check(this.#lockOf(key), options.token, options.signature);
    return this.gate.read(key, options.token);
  }
}
