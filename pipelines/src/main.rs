fn main() {
    eprintln!("dualgp: no command yet");
    std::process::exit(2)
}
