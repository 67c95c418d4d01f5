import { randomBytes } from "node:crypto";

/*
 * UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then randomness. Ids made later sort later, so an
 * index on them is appended to at its right edge and "oldest first" is "smallest id first". Within one
 * millisecond the 12-bit `rand_a` field is used as a counter (RFC 9562 §6.2, method 1), so ids made by
 * this process are strictly increasing; when the counter runs out the timestamp borrows a millisecond.
 */
let lastMs = -1;
let seq = 0;

// Random bytes drawn 4 KiB at a time (as node:crypto's randomUUID does): one call into the CSPRNG per
// 256 ids instead of one or two per id, which showed in the relay's and writer's profiles.
const POOL = 4096;
let pool = Buffer.alloc(0);
let used = POOL;
function random(n: number): Buffer {
  if (used + n > pool.length) {
    pool = randomBytes(POOL);
    used = 0;
  }
  const out = pool.subarray(used, used + n);
  used += n;
  return out;
}

export function uuidv7(nowMs: number = Date.now()): string {
  if (nowMs > lastMs) {
    lastMs = nowMs;
    seq = random(2).readUInt16BE(0) & 0x3ff; // random start, with room to count up
  } else if (++seq > 0xfff) {
    lastMs++;
    seq = 0;
  }
  const b = random(16);
  let ms = lastMs;
  for (let i = 5; i >= 0; i--) {
    b[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  b[6] = 0x70 | (seq >> 8);
  b[7] = seq & 0xff;
  b[8] = 0x80 | (b[8]! & 0x3f);
  const h = b.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
