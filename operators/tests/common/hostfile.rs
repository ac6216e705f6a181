//! A timely hostfile on loopback, shared by the operator's and the
//! pipelines' cluster tests.

/// A timely hostfile of two free ports on 127.0.0.1, in `dir`.
pub fn hostfile(dir: &std::path::Path) -> std::path::PathBuf {
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let path = dir.join("hosts");
    std::fs::write(
        &path,
        ports.iter().map(|p| format!("127.0.0.1:{p}\n")).collect::<String>(),
    )
    .unwrap();
    path
}
