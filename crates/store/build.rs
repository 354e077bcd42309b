//! `sqlx::migrate!` embeds the migration files when this crate compiles,
//! but a new file alone would not make cargo compile it again: without
//! this, a build could run an older schema than its own source has.

fn main() {
    println!("cargo::rerun-if-changed=migrations");
}
