//! File exports as a long-running service gets them: with 1 s chunks, the
//! pprof and OTLP files are written while the service runs (a process
//! killed now keeps every finished chunk), each chunk in its own file,
//! rotated like log files (`path`, `path.1`, `path.2`), never more than the
//! files kept; each file decodes and holds the request handler's stacks.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use sentry_profiling::hooks::workspace::pprof_proto::Profile;
use sentry_profiling::{EnvelopeDirTransport, ProfileLifecycle, ProfilingIntegration};
use sentry_profiling_tests::{http_get, local_settings, run_service_with};

const KEPT: usize = 3;

fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn read_pprof(path: &Path) -> Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    Profile::decode(raw.as_slice()).unwrap()
}

/// Whether the profile has samples in `burn_cpu`.
fn burns(p: &Profile) -> bool {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let Some(burn) = p
        .function
        .iter()
        .find(|f| s(f.name) == "sentry_profiling_examples::burn_cpu")
    else {
        return false;
    };
    let locs: HashSet<u64> = p
        .location
        .iter()
        .filter(|l| l.line.iter().any(|line| line.function_id == burn.id))
        .map(|l| l.id)
        .collect();
    p.sample
        .iter()
        .any(|s| s.location_id.iter().any(|l| locs.contains(l)))
}

#[test]
fn files_are_written_per_chunk_and_rotated() {
    let settings = local_settings("export-rotation");
    let dir = settings.envelope_dir.clone();
    let pprof = dir.join("profile.pb.gz");
    let otlp = dir.join("profile.otlp.pb");
    let mut options = sentry::ClientOptions::new().traces_sample_rate(1.0);
    options.dsn = sentry_profiling_examples::LOCAL_DSN.parse().ok();
    options.transport = Some(EnvelopeDirTransport::factory(&dir).unwrap());
    let options = ProfilingIntegration::new()
        .profile_session_sample_rate(1.0)
        .profile_lifecycle(ProfileLifecycle::Trace)
        .chunk_duration(Duration::from_secs(1))
        .pprof_file(&pprof)
        .otlp_file(&otlp)
        .export_files_kept(KEPT)
        .apply(options);
    let (pprof_c, otlp_c) = (pprof.clone(), otlp.clone());
    let during = run_service_with(
        options,
        sentry_profiling_examples::router(),
        |addr, _| async move {
            // Requests for long enough that several chunks finish.
            let started = Instant::now();
            let mut during = None;
            while started.elapsed() < Duration::from_secs(6) {
                let a = tokio::spawn(http_get(addr, "/work/40"));
                let b = tokio::spawn(http_get(addr, "/work/40"));
                assert!(a.await.unwrap().starts_with("HTTP/1.1 200"));
                assert!(b.await.unwrap().starts_with("HTTP/1.1 200"));
                if during.is_none() && started.elapsed() > Duration::from_secs(4) {
                    // Still running: what a SIGKILL now would leave behind.
                    during = Some((pprof_c.exists(), otlp_c.exists(), read_pprof(&pprof_c)));
                }
            }
            during
        },
    );
    let (pprof_there, otlp_there, early) = during.expect("looked while running");
    assert!(
        pprof_there && otlp_there,
        "the files exist while the service still runs"
    );
    assert!(burns(&early), "a finished chunk is on disk with its stacks");

    // After shutdown: the newest chunk at the path, the two before rotated.
    let mut starts = Vec::new();
    for n in 0..KEPT {
        let path = if n == 0 {
            pprof.clone()
        } else {
            rotated(&pprof, n)
        };
        let p = read_pprof(&path);
        assert!(!p.sample.is_empty(), "{} has samples", path.display());
        assert!(p.duration_nanos <= 3_000_000_000, "one chunk per file");
        starts.push((p.time_nanos, p.time_nanos + p.duration_nanos));
        let otlp_path = if n == 0 {
            otlp.clone()
        } else {
            rotated(&otlp, n)
        };
        let req =
            ExportProfilesServiceRequest::decode(std::fs::read(&otlp_path).unwrap().as_slice())
                .unwrap();
        assert!(
            !req.resource_profiles[0].scope_profiles[0].profiles[0]
                .samples
                .is_empty()
        );
    }
    // Newest first, by each file's latest sample. Not by its earliest: a
    // thread's samples leave its ledger in time order but threads' do not
    // arrive in order among themselves, and on a loaded machine a sample
    // held a while (its thread not yet known alive at its time) can reach
    // the writer after the next chunk began, which then starts before the
    // one written before it. The sample that ends a chunk opens the next,
    // so the latest samples are in the order the files were written.
    assert!(
        starts.windows(2).all(|w| w[0].1 > w[1].1),
        "newest first (first, last sample of each): {starts:?}"
    );
    for n in 1..KEPT {
        // Whole chunks of the run, all of it spent in `/work` requests.
        assert!(
            burns(&read_pprof(&rotated(&pprof, n))),
            "{} holds the handler's stacks",
            rotated(&pprof, n).display()
        );
    }
    for path in [&pprof, &otlp] {
        assert!(
            !rotated(path, KEPT).exists(),
            "no more than {KEPT} files are kept"
        );
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        assert!(!PathBuf::from(partial).exists(), "no partial file is left");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
