//! `cargo run -p node --example serve -- [CONFIG]`: the server without the CLI (for
//! development; the binary's `pagewarden serve` calls the same function).

fn main() {
    let config = std::env::args().nth(1).map(std::path::PathBuf::from);
    if let Err(e) = node::run_serve_cli(config.as_deref(), None) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
