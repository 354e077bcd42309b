//! A notification template as an operator writes one: compiled with the
//! built-ins, then rendered with the sample notice that start-up renders.
//! Every render is bounded (the environment's fuel), so a template that
//! loops is an error, not a timeout.
#![no_main]

use acme_proxy::notify::templates::Templates;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(templates) = Templates::from_sources(vec![("fuzz.txt".into(), source.into())]) {
        let _ = templates.check("fuzz.txt");
    }
});
