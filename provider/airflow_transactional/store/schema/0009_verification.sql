-- The shadow audit (core/verify.py, docs/guides/verification.md): what checking each committed txid
-- found -- verified (recomputed from its source by the same code: the same deltas), failed (other
-- deltas, or a state that no longer adds up to its history: the detail names the states and keys),
-- unverifiable (its input gone before it was checked, or committed under code no longer deployed:
-- the detail says which), superseded (committed under other code, its range corrected since: it
-- passes once that correction is verified) or skipped (not sampled). A committed txid without a row
-- is pending. verified_through: the last txid of the contiguous run of passing txids from the first.
CREATE TABLE {s}.verifications (
    topology_id text NOT NULL,
    txid        bigint NOT NULL,
    status      text NOT NULL CHECK (status IN ('verified', 'failed', 'unverifiable', 'superseded', 'skipped')),
    detail      jsonb NOT NULL DEFAULT jsonb_build_object(),
    checked_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topology_id, txid),
    FOREIGN KEY (topology_id, txid) REFERENCES {s}.commits ON DELETE CASCADE
);
ALTER TABLE {s}.topologies ADD COLUMN verified_through bigint NOT NULL DEFAULT 0;
