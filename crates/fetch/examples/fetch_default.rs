fn main() {
    match fetch::ensure_default_model() {
        Ok(p) => println!("{}", p.display()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}
