//! Records the commit the binary is built from, for `acme-proxy --version`:
//! `SOURCE_COMMIT` when the builder sets it (a source tarball has
//! no git), else `git rev-parse`, else "unknown". Neither name starts with
//! `ACME_PROXY_`: cargo also puts `BUILD_COMMIT` into the environment of
//! `cargo run` and of the tests, and the server refuses unknown
//! `ACME_PROXY_*` variables.

use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=SOURCE_COMMIT");
    let commit = std::env::var("SOURCE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // Rebuild when HEAD moves: HEAD itself (a checkout), the file of the
    // branch it points at (a commit) and packed-refs. Only files that exist:
    // cargo reruns a script on every build for a missing one.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo::rerun-if-changed={path}");
        }
    }
    println!("cargo::rustc-env=BUILD_COMMIT={commit}");
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}
