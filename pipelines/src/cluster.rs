//! Timely's cluster mode on the command line: `--processes N --process I
//! --hostfile FILE` beside `--workers W` per process, as timely's own
//! `-n/-p/-h/-w`. Every process is started with the same arguments but its
//! own `--process`; worker `w` of process `p` is worker `p·W + w` of `N·W`,
//! so the input is shared out exactly as among `N·W` threads of one process.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::model_args::check_workers;

/// Timely's first port when no hostfile is given (`localhost:2101`, `2102`, …).
const FIRST_DEFAULT_PORT: u16 = 2101;

/// The flags that make a process one of a timely cluster.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ClusterArgs {
    /// Processes in the timely cluster (timely's `-n`); start each with its own `--process`.
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// This process's index, 0 to processes − 1 (timely's `-p`); process 0
    /// writes the outputs (replay) and the checkpoints (serve).
    #[arg(long, default_value_t = 0)]
    pub process: usize,
    /// One `host:port` a line, process 0's first (timely's `-h`); without it
    /// 127.0.0.1:2101, 127.0.0.1:2102, … Blank lines and `#` comments are skipped.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
}

impl Default for ClusterArgs {
    fn default() -> Self {
        ClusterArgs {
            processes: 1,
            process: 0,
            hostfile: None,
        }
    }
}

impl ClusterArgs {
    /// The timely configuration for `workers` threads in this process, or
    /// one line saying which flag is wrong.
    pub fn timely_config(&self, workers: usize) -> Result<timely::Config> {
        check_workers(workers)?;
        self.check_indices()?;
        if self.processes == 1 {
            return Ok(timely::Config::process(workers));
        }
        let addresses = self.addresses()?;
        Ok(timely::Config {
            communication: timely::CommunicationConfig::Cluster {
                threads: workers,
                process: self.process,
                addresses,
                report: false,
                zerocopy: false,
            },
            worker: timely::WorkerConfig::default(),
        })
    }

    /// Whether this process writes the predictions, reports and dead letters:
    /// it holds worker 0, to which every worker sends them.
    pub fn writes_outputs(&self) -> bool {
        self.process == 0
    }

    fn check_indices(&self) -> Result<()> {
        if self.processes == 0 {
            bail!("--processes 0: give at least one process");
        }
        if self.process >= self.processes {
            bail!(
                "--process {} is not below --processes {}: number the processes 0 to {}",
                self.process,
                self.processes,
                self.processes - 1
            );
        }
        Ok(())
    }

    /// The first `processes` addresses of the hostfile, or timely's defaults.
    fn addresses(&self) -> Result<Vec<String>> {
        let Some(path) = &self.hostfile else {
            return Ok((0..self.processes)
                .map(|i| format!("127.0.0.1:{}", usize::from(FIRST_DEFAULT_PORT) + i))
                .collect());
        };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read the hostfile {}", path.display()))?;
        let addresses = host_lines(&text, path)?;
        if addresses.len() < self.processes {
            bail!(
                "the hostfile {} has {} address(es), one host:port a line, but --processes is {}",
                path.display(),
                addresses.len(),
                self.processes
            );
        }
        Ok(addresses.into_iter().take(self.processes).collect())
    }
}

/// The `host:port` lines of a hostfile's `text` (read from `path`, which
/// the errors name). Names are not resolved here: on a container network
/// they may resolve only once every peer is up.
pub fn host_lines(text: &str, path: &Path) -> Result<Vec<String>> {
    let mut addresses = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let port = line.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
        let host_ok = |host: &str| !host.is_empty() && !host.contains(char::is_whitespace);
        if !matches!(port, Some((host, Ok(_))) if host_ok(host)) {
            let shown = dualgp_connectors::one_line(line);
            bail!("{} line {}: `{shown}` is not host:port", path.display(), number + 1);
        }
        addresses.push(line.to_owned());
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use timely::CommunicationConfig;

    /// A carriage return inside a line (noticed while fuzzing the hostfile
    /// parser) is shown escaped: the error stays one line.
    #[test]
    fn a_control_character_in_a_hostfile_line_is_shown_escaped() {
        let err = host_lines("node-a\rx:4000\n", Path::new("hosts"))
            .unwrap_err()
            .to_string();
        assert_eq!(err, "hosts line 1: `node-a\\rx:4000` is not host:port");
    }

    fn cluster(processes: usize, process: usize, hostfile: Option<PathBuf>) -> ClusterArgs {
        ClusterArgs {
            processes,
            process,
            hostfile,
        }
    }

    #[test]
    fn one_process_is_timely_process_config_and_several_read_the_hostfile() {
        let config = ClusterArgs::default().timely_config(3).unwrap();
        assert!(matches!(config.communication, CommunicationConfig::Process(3)));

        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "# the cluster\nnode-a:4000\n\n  node-b:4001  \nnode-c:4002\n").unwrap();
        let config = cluster(2, 1, Some(hosts)).timely_config(2).unwrap();
        let CommunicationConfig::Cluster {
            threads,
            process,
            addresses,
            ..
        } = config.communication
        else {
            panic!("two processes are a cluster");
        };
        assert_eq!((threads, process), (2, 1));
        assert_eq!(addresses, ["node-a:4000", "node-b:4001"]);
    }

    #[test]
    fn without_a_hostfile_the_processes_take_timely_default_ports() {
        let config = cluster(2, 0, None).timely_config(1).unwrap();
        let CommunicationConfig::Cluster { addresses, .. } = config.communication else {
            panic!("two processes are a cluster");
        };
        assert_eq!(addresses, ["127.0.0.1:2101", "127.0.0.1:2102"]);
    }

    #[test]
    fn wrong_flags_are_one_line_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "127.0.0.1:4000\n").unwrap();
        let garbled = dir.path().join("garbled");
        std::fs::write(&garbled, "127.0.0.1:4000\nnode-b\n").unwrap();
        let two_on_a_line = dir.path().join("two");
        std::fs::write(&two_on_a_line, "node-a:4000 node-b:4001\n").unwrap();
        let cases = [
            (cluster(2, 2, None), "--process 2 is not below --processes 2"),
            (cluster(0, 0, None), "--processes 0"),
            (cluster(2, 0, Some(short)), "has 1 address(es)"),
            (
                cluster(2, 0, Some(dir.path().join("absent"))),
                "cannot read the hostfile",
            ),
            (cluster(2, 1, Some(garbled)), "line 2: `node-b` is not host:port"),
            (
                cluster(2, 1, Some(two_on_a_line)),
                "line 1: `node-a:4000 node-b:4001` is not host:port",
            ),
        ];
        for (args, needle) in cases {
            let err = format!("{:#}", args.timely_config(1).unwrap_err());
            assert!(err.contains(needle) && !err.contains('\n'), "{err:?} lacks {needle:?}");
        }
    }
}
