//! TLS on the client listener against real `replog` processes on
//! loopback (free ports, every wait bounded): the official `iggy` 0.11.0
//! SDK over TLS, plain and wrongly-trusting clients refused, client
//! certificates (with a raw rustls client: the SDK cannot present one),
//! the handshake held to the login timeout, and the Python SDK
//! (`apache-iggy` 0.9.0 through `scripts/python_sdk.sh`).
//!
//! The certificates are the fixed ones in `tests/data/tls` (README there).
#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use consensus::header::HEADER_SIZE;
use iggy::prelude::*;
use iggy_binary_protocol::consensus::{Command as WireCommand, Operation};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

mod support;
use support::metrics::scrape;
use support::process::Replog;
use support::sdk_flows::{self, bounded, runtime};

const TIMEOUT: Duration = Duration::from_secs(10);

fn tls_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tls")
        .join(name)
}

/// A single TLS replica on a free port with its metrics endpoint; with
/// `client_ca`, clients must present a certificate signed by it. `extra`
/// goes into `[client]`.
fn tls_replica(dir: &Path, client_ca: Option<&str>, extra: &str) -> Replog {
    let config = dir.join("replog.toml");
    let mut tls = format!(
        "[client]\n{extra}\n[client.tls]\nenabled = true\ncert_file = {:?}\nkey_file = {:?}\n",
        tls_data("server-chain.pem"),
        tls_data("server.key"),
    );
    if let Some(ca) = client_ca {
        tls.push_str(&format!("client_ca_file = {:?}\n", tls_data(ca)));
    }
    std::fs::write(&config, tls).unwrap();
    let args: Vec<OsString> = [
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.join("data").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .map(OsString::from)
    .to_vec();
    Replog::start_logging(&args, "warn,replog=info,server=info")
}

/// An SDK client of `addr` over TLS, trusting `ca` for `localhost`;
/// `retry` keeps the SDK's default reconnection, otherwise a failed
/// connect is final.
fn tls_client(addr: SocketAddr, ca: &str, retry: bool) -> IggyClient {
    let builder = IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .with_tls_enabled(true)
        .with_tls_domain("localhost".to_owned())
        .with_tls_ca_file(tls_data(ca).display().to_string());
    let builder = if retry {
        builder
    } else {
        builder.with_reconnection_max_retries(Some(0))
    };
    builder.build().unwrap()
}

/// A plain-TCP SDK client of `addr` whose failed connect is final.
fn plain_client(addr: SocketAddr) -> IggyClient {
    IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .with_reconnection_max_retries(Some(0))
        .build()
        .unwrap()
}

/// Logs `client` in, retried (at most 30 s) while the root user is being
/// created.
async fn log_in(client: &IggyClient) {
    client.connect().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.login_user("iggy", "iggy").await {
            Ok(_) => return,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("login over TLS: {e:?}"),
        }
    }
}

/// What a client that must be refused got: connecting, logging in and
/// creating stream `name` must fail, within 30 s.
async fn refused(client: &IggyClient, name: &str) -> IggyError {
    let attempt = async {
        client.connect().await?;
        client.login_user("iggy", "iggy").await?;
        client.create_stream(name).await
    };
    match tokio::time::timeout(Duration::from_secs(30), attempt).await {
        Ok(Ok(_)) => panic!("a client that must be refused created stream {name}"),
        Ok(Err(e)) => e,
        Err(_) => panic!("a client that must be refused was neither served nor refused in 30 s"),
    }
}

async fn stream_names(client: &IggyClient) -> Vec<String> {
    let mut names: Vec<String> = client
        .get_streams()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    names
}

/// Connections closed by a failed or unfinished TLS handshake so far.
fn handshakes_failed(replica: &Replog) -> f64 {
    scrape(replica.metrics_addr().unwrap()).sum(
        "replog_client_connections_limited_total",
        &["reason=\"tls_handshake\""],
    )
}

/// Waits (at most 10 s) until at least `n` handshakes failed.
fn await_handshakes_failed(replica: &Replog, n: f64) {
    let deadline = Instant::now() + TIMEOUT;
    while handshakes_failed(replica) < n {
        assert!(
            Instant::now() < deadline,
            "{} failed handshakes counted, {n} expected",
            handshakes_failed(replica)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn given_a_tls_listener_when_the_sdk_trusts_its_ca_should_log_in_create_send_and_poll_back() {
    let dir = tempfile::tempdir().unwrap();
    let replica = tls_replica(dir.path(), None, "");
    assert!(
        replica.logged_within("client listener speaks TLS", TIMEOUT),
        "the start-up log says TLS is on"
    );
    let rt = runtime();
    rt.block_on(bounded("the low-level flow over TLS", async {
        let client = tls_client(replica.addr, "ca.pem", true);
        log_in(&client).await;
        client.ping().await.unwrap();
        sdk_flows::low_level_flow(&client).await;
        // A second connection reads what the first wrote.
        let again = tls_client(replica.addr, "ca.pem", true);
        log_in(&again).await;
        let got = sdk_flows::poll_texts(
            &again,
            sdk_flows::LOW_LEVEL_STREAM,
            sdk_flows::LOW_LEVEL_TOPIC,
            1,
            0,
            100,
        )
        .await;
        assert_eq!(got.len(), sdk_flows::low_level_texts().len());
    }));
    assert_eq!(handshakes_failed(&replica), 0.0);
    replica.stop();
}

#[test]
fn given_a_tls_listener_when_a_plain_client_or_one_trusting_another_ca_connects_should_refuse_it_and_change_nothing()
 {
    let dir = tempfile::tempdir().unwrap();
    let replica = tls_replica(dir.path(), None, "");
    let rt = runtime();
    // The root user exists before the refusals, so none of them can pass
    // for a login that came too early.
    let good = rt.block_on(bounded("login over TLS", async {
        let client = tls_client(replica.addr, "ca.pem", true);
        log_in(&client).await;
        client
    }));
    rt.block_on(bounded("refusals", async {
        let e = refused(&plain_client(replica.addr), "plain").await;
        eprintln!("a plain SDK client got {e:?}");
        let e = refused(&tls_client(replica.addr, "other-ca.pem", false), "other-ca").await;
        assert!(
            matches!(e, IggyError::CannotEstablishConnection),
            "a client trusting another CA: {e:?}"
        );
    }));
    // Raw Iggy bytes (a 256-byte frame header's worth) are not a TLS
    // ClientHello: the connection is closed.
    let mut raw = TcpStream::connect_timeout(&replica.addr, TIMEOUT).unwrap();
    raw.set_read_timeout(Some(TIMEOUT)).unwrap();
    raw.write_all(&ping_frame()).unwrap();
    let mut byte = [0u8; 1];
    match raw.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        // A TLS alert record (content type 21) before the close.
        Ok(_) => assert_eq!(byte[0], 21, "a plain frame got a non-alert answer"),
        Err(e) => panic!("a plain frame was neither answered nor closed: {e}"),
    }
    await_handshakes_failed(&replica, 3.0);
    rt.block_on(bounded("nothing changed", async {
        assert!(stream_names(&good).await.is_empty());
        good.ping().await.unwrap();
    }));
    replica.stop();
}

#[test]
fn given_a_tls_listener_when_a_connection_never_finishes_its_handshake_should_close_it_at_the_login_timeout()
 {
    let dir = tempfile::tempdir().unwrap();
    let replica = tls_replica(dir.path(), None, "login_timeout_ms = 1000");
    let mut silent = TcpStream::connect_timeout(&replica.addr, TIMEOUT).unwrap();
    silent.set_read_timeout(Some(TIMEOUT)).unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let closed = matches!(silent.read(&mut byte), Ok(0))
        || matches!(silent.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
    assert!(closed, "a silent connection outlived the login timeout");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed after {:?}, before the login timeout",
        started.elapsed()
    );
    await_handshakes_failed(&replica, 1.0);
    replica.stop();
}

/// A PING request frame as the SDK encodes it (a non-replicated request,
/// the command code in the reserved bytes).
fn ping_frame() -> Vec<u8> {
    let mut reserved = [0u8; 60];
    reserved[..4].copy_from_slice(&1u32.to_le_bytes());
    let header = iggy_binary_protocol::RequestHeader {
        command: WireCommand::Request,
        operation: Operation::NonReplicated,
        size: HEADER_SIZE as u32,
        client: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        reserved,
        ..Default::default()
    };
    bytemuck::bytes_of(&header).to_vec()
}

/// A raw rustls client of `addr`, trusting the test CA, presenting the
/// certificate `identity` (`name.pem` and `name.key`) if given.
fn raw_tls(
    addr: SocketAddr,
    identity: Option<&str>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(tls_data("ca.pem")).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(name) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(tls_data(&format!("{name}.pem")))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
            let key = PrivateKeyDer::from_pem_file(tls_data(&format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    tcp.set_read_timeout(Some(TIMEOUT)).unwrap();
    tcp.set_write_timeout(Some(TIMEOUT)).unwrap();
    rustls::StreamOwned::new(connection, tcp)
}

/// Sends a PING over `stream`: `Ok(status)` of the reply, or the error
/// that ended the connection (a refused client certificate surfaces here:
/// in TLS 1.3 the server judges it after the client's handshake is done).
fn ping(
    stream: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
) -> std::io::Result<u32> {
    stream.write_all(&ping_frame())?;
    stream.flush()?;
    let mut header = [0u8; HEADER_SIZE];
    stream.read_exact(&mut header)?;
    assert_eq!(header[60], WireCommand::Reply as u8, "not a reply");
    let at = std::mem::offset_of!(iggy_binary_protocol::ReplyHeader, status);
    Ok(u32::from_le_bytes(header[at..at + 4].try_into().unwrap()))
}

#[test]
fn given_a_client_ca_when_clients_connect_should_serve_only_those_with_a_certificate_it_signed() {
    let dir = tempfile::tempdir().unwrap();
    let replica = tls_replica(dir.path(), Some("ca.pem"), "");
    assert!(replica.logged_within("client_certificates=\"required\"", TIMEOUT));
    // A certificate signed by the CA: the session runs (PING is served
    // before a login).
    let mut trusted = raw_tls(replica.addr, Some("client"));
    assert_eq!(ping(&mut trusted).unwrap(), 0, "PING over mutual TLS");
    assert_eq!(ping(&mut trusted).unwrap(), 0, "and again");
    // No certificate, or one signed by another CA: refused.
    for identity in [None, Some("stranger")] {
        let mut stream = raw_tls(replica.addr, identity);
        let e = ping(&mut stream).unwrap_err();
        eprintln!("{identity:?}: {e}");
    }
    // The SDK cannot present a certificate: refused too.
    let rt = runtime();
    rt.block_on(bounded("the SDK without a certificate", async {
        let e = refused(&tls_client(replica.addr, "ca.pem", false), "anonymous").await;
        eprintln!("the SDK without a certificate got {e:?}");
    }));
    await_handshakes_failed(&replica, 3.0);
    assert_eq!(ping(&mut trusted).unwrap(), 0, "still served");
    replica.stop();
}

/// The Python SDK (`apache-iggy` 0.9.0 from PyPI, in a venv that
/// `scripts/python_sdk.sh` makes under the target directory) over TLS:
/// it connects with a connection string, creates a stream and topic,
/// sends and polls back; a plain Python client is refused. Fails when pip
/// or PyPI is unavailable unless `REPLOG_SKIP_PYTHON=1`.
#[test]
fn given_a_tls_listener_when_the_python_sdk_connects_with_tls_should_send_and_poll_back() {
    if std::env::var("REPLOG_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("REPLOG_SKIP_PYTHON=1: the Python SDK test is skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let replica = tls_replica(dir.path(), None, "");
    let rt = runtime();
    // The root user exists before Python logs in.
    let client = rt.block_on(bounded("login over TLS", async {
        let client = tls_client(replica.addr, "ca.pem", true);
        log_in(&client).await;
        client
    }));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = manifest.join("../../scripts/python_sdk.sh");
    let program = manifest.join("tests/python/tls_flow.py");
    let tls = format!(
        "iggy+tcp://iggy:iggy@{}?tls=true&tls_domain=localhost&tls_ca_file={}",
        replica.addr,
        tls_data("ca.pem").display()
    );
    let plain = format!(
        "iggy+tcp://iggy:iggy@{}?reconnection_retries=0",
        replica.addr
    );
    let mut child = std::process::Command::new("bash")
        .arg(&script)
        .arg(&program)
        .args([&tls, &plain])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first run installs the package; later ones reuse the venv.
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the Python SDK run did not finish within 240 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        status.success(),
        "the Python SDK run failed ({status}); set REPLOG_SKIP_PYTHON=1 where pip or PyPI is \
         unavailable.\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        out.contains("python over tls: ok"),
        "stdout:\n{out}\nstderr:\n{err}"
    );
    // What Python wrote is there for the Rust SDK.
    rt.block_on(bounded("read back", async {
        let got = sdk_flows::poll_texts(&client, "python", "tls", 0, 0, 10).await;
        let texts: Vec<&str> = got.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["py-0", "py-1", "py-2"]);
        assert_eq!(stream_names(&client).await, ["python"]);
    }));
    replica.stop();
}

#[test]
fn given_tls_off_when_the_listener_is_not_on_loopback_should_warn_that_passwords_cross_in_clear() {
    let start = |dir: &Path, listen: &str| {
        let args: Vec<OsString> = [
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            listen,
            "--shards",
            "1",
        ]
        .map(OsString::from)
        .to_vec();
        Replog::start_with(&args)
    };
    let warning = "passwords cross the network in clear";
    let dir = tempfile::tempdir().unwrap();
    let open = start(&dir.path().join("open"), "0.0.0.0:0");
    assert!(open.logged_within(warning, TIMEOUT));
    open.stop();
    let local = start(&dir.path().join("local"), "127.0.0.1:0");
    // The warning comes before the serving line, which start_with awaited.
    assert!(!local.logged_within(warning, Duration::from_millis(500)));
    local.stop();
}
