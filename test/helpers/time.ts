/**
 * Test time over the database's clock. Stores read the time in SQL (`now()`), never from the process:
 * a test moves it with a `TimeShift` shared by its stores. `ms` reads as the time the statements see
 * (the database and the tests run on one machine, so `Date.now()` is the database's clock here) and
 * sets it: `now.ms += LEASE_MS` moves every store given `timeShift: now` a lease ahead.
 */
import type { TimeShift } from "../../src/postgres/keys/db-time.ts";

export class TestTime implements TimeShift {
  offsetMs = 0;
  constructor(at?: number) {
    if (at !== undefined) this.ms = at;
  }
  get ms(): number {
    return Date.now() + this.offsetMs;
  }
  set ms(at: number) {
    this.offsetMs = at - Date.now();
  }
}
