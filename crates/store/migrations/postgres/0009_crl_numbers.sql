-- One CRL number sequence per profile, shared by every process that signs
-- its CRL (another replica, the admin CLI): a number is taken by one
-- statement before signing, so two signers never sign two different CRLs
-- with one number (RFC 5280 §5.2.3 wants them to only grow). It carries on
-- from the newest stored CRL.
CREATE TABLE crl_numbers (
    profile  TEXT PRIMARY KEY,
    last     BIGINT NOT NULL
);
INSERT INTO crl_numbers (profile, last) SELECT profile, number FROM crls;
