-- What reconciliation against a provider found (`idem reconcile`, src/reconcile/): each difference
-- between the provider's charges and the service's records, once, under a stable id (a later run that
-- sees it again only updates `last_seen_at`), with what was done about it. A plain table outside the
-- partitioned keys: no sweep drops it. A finding's refund or review runs as a phases key of the
-- `reconcile` runner (`action_scope`, `action_key`): keyed like any other effect, so a refund happens
-- once however often the job runs, crashes or is repeated.
CREATE TABLE {{schema}}.reconcile_findings (
  id            text        PRIMARY KEY,  -- e.g. duplicate:ch_123, orphan:ch_456, missing:<reference>
  kind          text        NOT NULL,     -- duplicate | orphan | missing | amount-mismatch
  scope         text,                     -- the account (from the record, else the reference's prefix)
  reference     text,                     -- the downstream idempotency reference joining both sides
  charge_id     text,                     -- the provider's charge it is about (to refund)
  record_id     text,                     -- the service's record it is about
  amount        bigint      NOT NULL,     -- the difference, in minor units (what a refund would return)
  currency      text        NOT NULL,
  detail        text        NOT NULL,     -- one line for a person
  happened_at   timestamptz,              -- when the charge (or the record) was made
  found_at      timestamptz NOT NULL,
  last_seen_at  timestamptz NOT NULL,
  state         text        NOT NULL,     -- open | review | refunding | refunded | settled
  action        text,                     -- refund | review, when one was asked for
  action_scope  text,                     -- the key the action runs under
  action_key    text,
  refund_id     text,
  settled_at    timestamptz
);
CREATE INDEX reconcile_findings_state ON {{schema}}.reconcile_findings (state, found_at);
CREATE INDEX reconcile_findings_charge ON {{schema}}.reconcile_findings (charge_id) WHERE charge_id IS NOT NULL;
