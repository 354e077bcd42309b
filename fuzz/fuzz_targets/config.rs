//! The configuration file as `serve` and `config check` read it: TOML,
//! every section and key, and the checks that name each mistake, which
//! must refuse with a sentence rather than panic.
#![no_main]

use acme_proxy::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = Config::from_toml(text) {
        let _ = config.base_url();
        let _ = config.database_url_shown();
    }
});
