//! The URLs we hand out, in one place, so that the URL a JWS must carry
//! (RFC 8555 §6.4) and the URL a document links to can never disagree.

/// URLs of one profile.
#[derive(Debug, Clone)]
pub struct Urls {
    prefix: String,
}

impl Urls {
    pub fn new(base: &str, profile: &str) -> Self {
        Self {
            prefix: format!("{base}/profile/{profile}"),
        }
    }

    pub fn directory(&self) -> String {
        format!("{}/directory", self.prefix)
    }
    pub fn new_nonce(&self) -> String {
        format!("{}/new-nonce", self.prefix)
    }
    pub fn new_account(&self) -> String {
        format!("{}/new-account", self.prefix)
    }
    pub fn new_order(&self) -> String {
        format!("{}/new-order", self.prefix)
    }
    pub fn revoke_cert(&self) -> String {
        format!("{}/revoke-cert", self.prefix)
    }
    pub fn key_change(&self) -> String {
        format!("{}/key-change", self.prefix)
    }
    pub fn account(&self, id: &str) -> String {
        format!("{}/acct/{id}", self.prefix)
    }
    pub fn account_orders(&self, id: &str) -> String {
        format!("{}/acct/{id}/orders", self.prefix)
    }
    pub fn order(&self, id: &str) -> String {
        format!("{}/order/{id}", self.prefix)
    }
    pub fn finalize(&self, id: &str) -> String {
        format!("{}/order/{id}/finalize", self.prefix)
    }
    pub fn authz(&self, id: &str) -> String {
        format!("{}/authz/{id}", self.prefix)
    }
    pub fn challenge(&self, id: &str) -> String {
        format!("{}/chall/{id}", self.prefix)
    }
    pub fn certificate(&self, id: &str) -> String {
        format!("{}/cert/{id}", self.prefix)
    }
    pub fn crl(&self) -> String {
        format!("{}/crl", self.prefix)
    }
    pub fn ca_pem(&self) -> String {
        format!("{}/ca.pem", self.prefix)
    }
    /// RFC 9773 §3: without a trailing slash; clients append `/{certID}`.
    pub fn renewal_info(&self) -> String {
        format!("{}/renewal-info", self.prefix)
    }

    /// The account id a `kid` names, if it is an account URL of this
    /// profile. A `kid` of another profile (or another server) is `None`.
    pub fn account_id_from_kid<'a>(&self, kid: &'a str) -> Option<&'a str> {
        let id = kid
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("/acct/")?;
        (!id.is_empty() && !id.contains('/')).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kid_is_an_account_url_of_this_profile_only() {
        let u = Urls::new("http://h:1", "a");
        assert_eq!(
            u.account_id_from_kid("http://h:1/profile/a/acct/xyz"),
            Some("xyz")
        );
        assert_eq!(u.account_id_from_kid("http://h:1/profile/b/acct/xyz"), None);
        assert_eq!(
            u.account_id_from_kid("http://h:1/profile/ab/acct/xyz"),
            None
        );
        assert_eq!(
            u.account_id_from_kid("http://h:1/profile/a/acct/xyz/orders"),
            None
        );
        assert_eq!(u.account_id_from_kid("http://h:1/profile/a/acct/"), None);
    }
}
