//! A real Kafka-protocol broker (tansu) on a free 127.0.0.1 port for one test,
//! installed and started through scripts/broker.sh, killed on drop.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/broker.sh")
}

/// Run `broker.sh WHAT` (idempotent; serialised by the script's lock) with a bounded wait.
fn install(what: &str) {
    let mut child = Command::new(script())
        .arg(what)
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run scripts/broker.sh: {e}"));
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "scripts/broker.sh {what} failed: {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("scripts/broker.sh {what} took over 15 minutes");
        }
        sleep(Duration::from_millis(200));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for_port(port: u16, what: &str, log: &Path) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} did not listen on {addr} within 60 s; its log:\n{log}");
        }
        sleep(Duration::from_millis(100));
    }
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str], env: &[(String, String)], log: &Path) -> Process {
    let out = File::options().create(true).append(true).open(log).unwrap();
    let child = Command::new(script())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Process(child)
}

/// A tansu broker on 127.0.0.1.
pub struct Broker {
    process: Option<Process>,
    pub port: u16,
    /// The port clients are told to connect to: `port`, or a relay's.
    advertised: u16,
    storage: String,
    env: Vec<(String, String)>,
    log: PathBuf,
    _dir: tempfile::TempDir,
    _s3: Option<S3>,
}

impl Broker {
    /// Topics in memory: gone when the broker stops.
    pub fn start() -> Broker {
        install("install");
        Broker::launch("memory://tansu/".into(), Vec::new(), None, None)
    }

    /// Topics in memory, clients told to connect to 127.0.0.1:`advertised`
    /// (a relay in front of the broker) whatever port they first reached.
    /// [`start`](Self::start), with `topics` of `partitions` each made; and its address.
    #[allow(dead_code)] // for the tests that make their topics first
    pub fn with_topics(partitions: i32, topics: &[&str]) -> (Broker, String) {
        let broker = Broker::start();
        let address = broker.address();
        let conn = dualgp_connectors::KafkaConnection::new(&address).with_timeout(Duration::from_secs(20));
        for topic in topics {
            dualgp_connectors::kafka::create_topic(&conn, topic, partitions).unwrap();
        }
        (broker, address)
    }

    #[allow(dead_code)] // for the tests that put a relay in front of the broker
    pub fn start_advertising(advertised: u16) -> Broker {
        install("install");
        Broker::launch("memory://tansu/".into(), Vec::new(), None, Some(advertised))
    }

    /// Topics in a local S3 server (moto) that outlives broker restarts.
    pub fn start_durable() -> Broker {
        install("install-s3");
        let s3 = S3::start();
        let env = vec![
            ("AWS_ENDPOINT".into(), format!("http://127.0.0.1:{}", s3.port)),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
            ("AWS_ACCESS_KEY_ID".into(), "test".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "test".into()),
            ("AWS_DEFAULT_REGION".into(), "us-east-1".into()),
        ];
        Broker::launch("s3://tansu/".into(), env, Some(s3), None)
    }

    fn launch(storage: String, env: Vec<(String, String)>, s3: Option<S3>, advertised: Option<u16>) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut broker = Broker {
            process: None,
            port,
            advertised: advertised.unwrap_or(port),
            storage,
            env,
            log: dir.path().join("broker.log"),
            _dir: dir,
            _s3: s3,
        };
        broker.restart();
        broker
    }

    /// The port of the durable broker's S3 server (bucket `tansu`).
    #[allow(dead_code)] // for the tests that write to the store themselves
    pub fn s3_port(&self) -> Option<u16> {
        self._s3.as_ref().map(|s3| s3.port)
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        self.process = None;
    }

    /// Start (again) on the same port with the same storage.
    pub fn restart(&mut self) {
        self.stop();
        let (port, advertised) = (self.port.to_string(), self.advertised.to_string());
        self.process = Some(spawn(&["run", &port, &self.storage, &advertised], &self.env, &self.log));
        wait_for_port(self.port, "the broker", &self.log);
    }
}

/// A local S3 server (moto) with an empty bucket `tansu`.
struct S3 {
    _process: Process,
    port: u16,
    _dir: tempfile::TempDir,
}

impl S3 {
    fn start() -> S3 {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("s3.log");
        let port = free_port();
        let process = spawn(&["s3", &port.to_string()], &[], &log);
        wait_for_port(port, "the S3 server", &log);
        // Create the bucket: one plain HTTP request.
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            stream,
            "PUT /tansu HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "creating the bucket: {answer}");
        S3 {
            _process: process,
            port,
            _dir: dir,
        }
    }
}
