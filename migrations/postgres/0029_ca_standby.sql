-- The cluster CA's standby (postgres). Keep equivalent to migrations/sqlite/0029_ca_standby.sql.
-- A CA made ahead of the cluster CA's next rotation, its key sealed as every CA key is: what
-- operators' clients trust (GET /clusters/{id}/trust, the kubeconfigs the API hands out) carries
-- it beside the CA in use, so a client whose trust file was written before a rotation still
-- verifies the apiservers' certificates the rotation brings. The rotation takes it as its new CA,
-- and a new standby is made when the rotation ends. No row: none yet (a cluster founded before
-- standbys existed: its next rotation makes its new CA then, and a standby after it).
CREATE TABLE ca_standby (
    cluster_id  BIGINT  PRIMARY KEY REFERENCES clusters (id) ON DELETE CASCADE,
    cert        TEXT    NOT NULL,
    key_sealed  TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL
);
