-- The outbox's wake-up without a NOTIFY inside the writers' transactions. PostgreSQL makes every
-- transaction that notifies wait, at commit, for one lock of the whole cluster, held through its WAL
-- flush: writers of events committed one at a time (bench/outbox-notify.ts). A transaction run by
-- idem's drivers (fromPg, fromPostgresJs) now says so with idem.outbox_wake, and its driver sends the
-- NOTIFY after the commit, outside it, coalesced with other transactions'. Other writers (your own
-- transactions, another driver, SQL) still notify from the trigger, as before.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('idem.outbox_wake', true) IS DISTINCT FROM 'after-commit' THEN
    PERFORM pg_notify('{{schema}}_outbox', '');
  END IF;
  RETURN NULL;
END $$;
