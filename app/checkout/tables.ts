/** The checkout saga's tables (made by app/database.ts's `prepareSchema`, the owner's job). */
export const CHECKOUT_TABLES = `
  CREATE TABLE IF NOT EXISTS stock (
    sku        text PRIMARY KEY,
    available  integer NOT NULL CHECK (available >= 0)
  );
  INSERT INTO stock (sku, available) VALUES ('mug', 1000), ('poster', 1000), ('lamp', 3)
    ON CONFLICT (sku) DO NOTHING;
  CREATE TABLE IF NOT EXISTS checkouts (
    id            text PRIMARY KEY,
    account_id    text NOT NULL,
    idem_key      text NOT NULL,            -- the Idempotency-Key that placed it (its timeline shows the saga)
    sku           text NOT NULL,
    quantity      integer NOT NULL CHECK (quantity > 0),
    amount_cents  bigint NOT NULL CHECK (amount_cents > 0),
    currency      text NOT NULL,
    card          text,
    country       text NOT NULL,
    status        text NOT NULL,            -- placed, reserved, charged, shipped | rejected | releasing, refunding, cancelled
    charge_id     text,
    refund_id     text,
    shipment_id   text,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
  );
  CREATE INDEX IF NOT EXISTS checkouts_account ON checkouts (account_id, created_at DESC);
  CREATE TABLE IF NOT EXISTS checkout_steps (
    checkout_id  text NOT NULL,
    step         text NOT NULL,             -- each step at most once per checkout
    message_id   text NOT NULL,             -- the event that made it
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    details      jsonb,
    PRIMARY KEY (checkout_id, step)
  );
`;
