-- What each phase of a key's runner needs in its data (e.g. "charged" needs the provider's chargeId),
-- recorded when the key goes to review (src/postgres/phases/needs.ts). A person settles a review where
-- the runner's definition is not at hand (the CLI, the console): a settlement that resumes the key at
-- a phase without what it needs is refused before anything changes, never left answering 500.
ALTER TABLE {{schema}}.reviews ADD COLUMN phases jsonb;
