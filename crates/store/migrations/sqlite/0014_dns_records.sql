-- The embedded authoritative DNS zone ([dns_zone]): the TXT values it
-- serves, under their owner name (lower case, no final dot), kept in the
-- database so that they survive a restart and every replica serves them.
CREATE TABLE dns_records (
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (name, value)
);

-- Each zone's SOA serial, moved on at every change of its records.
CREATE TABLE dns_zone_serials (
    zone   TEXT PRIMARY KEY,
    serial BIGINT NOT NULL
);
