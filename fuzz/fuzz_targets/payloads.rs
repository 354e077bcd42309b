//! Every ACME request payload (RFC 8555 §7.3–7.6), parsed as the server
//! parses it, with the External Account Binding inside newAccount.
#![no_main]

use acme_proxy_protocol::eab::Eab;
use acme_proxy_protocol::types::{
    AccountUpdate, Finalize, KeyChange, NewAccount, NewOrder, Revocation,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<NewOrder>(data);
    let _ = serde_json::from_slice::<Finalize>(data);
    let _ = serde_json::from_slice::<Revocation>(data);
    let _ = serde_json::from_slice::<KeyChange>(data);
    let _ = serde_json::from_slice::<AccountUpdate>(data);
    if let Ok(account) = serde_json::from_slice::<NewAccount>(data)
        && let Some(binding) = &account.external_account_binding
        && let Ok(eab) = Eab::parse(binding)
    {
        let _ = eab.verify(b"an hmac key");
    }
});
