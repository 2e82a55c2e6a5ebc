#![allow(clippy::unwrap_used)]

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml(text, Path::new("test.toml"))
}

fn cli(args: &[&str]) -> Cli {
    let mut all = vec!["replog"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all).unwrap()
}

#[test]
fn given_nothing_when_resolved_should_give_the_documented_defaults() {
    let c = Config::effective(&Overrides::default(), 4).unwrap();
    assert_eq!(c.data_dir, PathBuf::from("./data"));
    assert_eq!(c.client.listen, "127.0.0.1:8090".parse().unwrap());
    assert_eq!(c.replica.listen, "127.0.0.1:8091".parse().unwrap());
    assert_eq!(
        (c.root.username.as_str(), c.root.password.as_str()),
        ("iggy", "iggy")
    );
    assert_eq!(c.shards, 4, "0 resolves to one shard per core");
    assert_eq!(c.tick_ms, 10);
    assert_eq!(c.cluster_id, 1);
    assert_eq!(c.replica_id, 0);
    assert_eq!(c.storage.segment_size_bytes, common::GIB);
    assert!(c.storage.fsync);
    assert_eq!(c.roster().len(), 1);
}

#[test]
fn given_a_partial_file_when_parsed_should_keep_defaults_for_the_rest() {
    let c = parse("tick_ms = 5\n[client]\nlisten = \"0.0.0.0:9000\"\n").unwrap();
    assert_eq!(c.tick_ms, 5);
    assert_eq!(c.client.listen.port(), 9000);
    assert_eq!(
        c.client.frame_size_max_bytes,
        consensus::header::FRAME_SIZE_MAX_DEFAULT
    );
    assert_eq!(c.root.username, "iggy");
}

#[test]
fn given_unknown_fields_when_parsed_should_refuse_them() {
    for text in [
        "tick = 5\n",
        "[client]\nport = 1\n",
        "[root]\nuser = \"x\"\n",
        "[storage]\nsegment_size = 1\n",
        "[[replicas]]\nid = 0\nclient_address = \"127.0.0.1:1\"\nreplica_address = \"127.0.0.1:2\"\nhost = \"x\"\n",
    ] {
        assert!(
            matches!(parse(text), Err(ConfigError::Parse { .. })),
            "{text}"
        );
    }
}

#[test]
fn given_wrong_types_when_parsed_should_refuse_them() {
    assert!(parse("tick_ms = \"fast\"\n").is_err());
    assert!(parse("[client]\nlisten = \"not an address\"\n").is_err());
    assert!(parse("replica_id = 300\n").is_err());
}

#[test]
fn given_file_env_and_flags_when_resolved_should_let_flags_win_over_the_file() {
    let dir = std::env::temp_dir().join(format!("replog-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("replog.toml");
    std::fs::write(
        &path,
        "data_dir = \"/from/file\"\ntick_ms = 20\n[root]\npassword = \"file\"\n",
    )
    .unwrap();
    let file_only = cli(&["--config", path.to_str().unwrap()]);
    let c = Config::effective(&file_only.overrides, 2).unwrap();
    assert_eq!(c.data_dir, PathBuf::from("/from/file"));
    assert_eq!(c.tick_ms, 20);
    let flags = cli(&[
        "--config",
        path.to_str().unwrap(),
        "--data-dir",
        "/from/flag",
        "--root-password",
        "flag",
        "config",
    ]);
    assert_eq!(flags.command, Some(Command::Config));
    let c = Config::effective(&flags.overrides, 2).unwrap();
    assert_eq!(c.data_dir, PathBuf::from("/from/flag"));
    assert_eq!(c.tick_ms, 20, "fields without a flag keep the file's value");
    assert_eq!(c.root.password, "flag");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn given_the_password_variable_when_parsed_should_fill_the_password_flag() {
    // Setting a variable in-process is unsafe in edition 2024 (and the
    // workspace denies unsafe), so check that clap is told to read it;
    // clap's env lookup then makes a flag win over the variable.
    let cmd = <Cli as clap::CommandFactory>::command();
    let arg = cmd
        .get_arguments()
        .find(|a| a.get_id() == "root_password")
        .unwrap();
    assert_eq!(arg.get_env(), Some(std::ffi::OsStr::new(ROOT_PASSWORD_ENV)));
}

#[test]
fn given_a_roster_when_validated_should_check_ids_size_and_self() {
    let roster = |ids: &[u8]| -> String {
        ids.iter()
            .map(|id| {
                format!(
                    "[[replicas]]\nid = {id}\nclient_address = \"127.0.0.1:{}\"\nreplica_address = \"127.0.0.1:{}\"\n",
                    8090 + u16::from(*id) * 10,
                    8091 + u16::from(*id) * 10
                )
            })
            .collect()
    };
    let ok = parse(&roster(&[0, 1, 2])).unwrap();
    ok.validate().unwrap();
    assert_eq!(ok.roster().len(), 3);
    let two = parse(&roster(&[0, 1])).unwrap();
    assert!(matches!(
        two.validate(),
        Err(ConfigError::Invalid {
            field: "replicas",
            ..
        })
    ));
    let gap = parse(&roster(&[0, 1, 3])).unwrap();
    assert!(gap.validate().is_err());
    let mut stranger = parse(&roster(&[0, 1, 2])).unwrap();
    stranger.replica_id = 1;
    assert!(
        stranger.validate().is_err(),
        "replica 1's roster entry names ports 8100/8101, not its listeners"
    );
    stranger.client.listen = "127.0.0.1:8100".parse().unwrap();
    stranger.replica.listen = "127.0.0.1:8101".parse().unwrap();
    stranger.validate().unwrap();
}

#[test]
fn given_out_of_range_values_when_validated_should_name_the_field() {
    for (text, field) in [
        ("tick_ms = 0\n", "tick_ms"),
        (
            "[storage]\nsegment_size_bytes = 0\n",
            "storage.segment_size_bytes",
        ),
        (
            "[client]\nframe_size_max_bytes = 100\n",
            "client.frame_size_max_bytes",
        ),
        ("[root]\npassword = \"\"\n", "root.password"),
        ("replica_id = 2\n", "replica_id"),
    ] {
        let err = parse(text).unwrap().validate().unwrap_err();
        assert!(
            matches!(err, ConfigError::Invalid { field: f, .. } if f == field),
            "{text}: {err}"
        );
    }
}

#[test]
fn given_the_effective_config_when_printed_should_parse_back_without_the_password() {
    let c = Config::effective(&Overrides::default(), 2).unwrap();
    let text = c.to_toml_redacted();
    assert!(!text.contains("password = \"iggy\""));
    assert!(text.contains("<redacted>"));
    let back = parse(&text).unwrap();
    assert_eq!(back.data_dir, c.data_dir);
    assert_eq!(back.client, c.client);
    assert_eq!(back.shards, 2);
}

#[test]
fn given_the_docs_when_compared_should_document_every_field() {
    let docs = include_str!("../../../../docs/configuration.md");
    let printed = Config::default().to_toml_redacted();
    let mut section = String::new();
    for line in printed.lines() {
        let line = line.trim();
        if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = format!("{s}.");
            continue;
        }
        if let Some((key, _)) = line.split_once(" = ") {
            let field = format!("`{section}{key}`");
            assert!(docs.contains(&field), "docs/configuration.md lacks {field}");
        }
    }
    for field in [
        "`metrics.listen`",
        "`client.tls.cert_file`",
        "`client.tls.key_file`",
        "`client.tls.client_ca_file`",
        "`replicas`",
        "`replicas.id`",
        "`replicas.client_address`",
        "`replicas.replica_address`",
    ] {
        assert!(docs.contains(field), "docs/configuration.md lacks {field}");
    }
}

#[test]
fn given_a_metrics_section_when_resolved_should_serve_only_what_it_names() {
    let c = Config::effective(&Overrides::default(), 1).unwrap();
    assert_eq!(c.metrics.listen, None, "off by default");
    assert!(c.metrics.partition_series);
    let c = parse("[metrics]\nlisten = \"127.0.0.1:9464\"\npartition_series = false\n").unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert!(!c.metrics.partition_series);
    let printed = c.to_toml_redacted();
    assert_eq!(parse(&printed).unwrap().metrics, c.metrics, "{printed}");
    let flagged = cli(&["--metrics-listen", "127.0.0.1:0"]);
    let c = Config::effective(&flagged.overrides, 1).unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:0".parse().unwrap()));
    let clash = cli(&["--metrics-listen", "127.0.0.1:8090"]);
    let err = Config::effective(&clash.overrides, 1).unwrap_err();
    assert!(err.to_string().contains("metrics.listen"), "{err}");
}

#[test]
fn given_a_consensus_section_when_validated_should_bound_it_by_ticks_and_heartbeats() {
    let c = parse("[consensus]\nheartbeat_ms = 250\nprimary_timeout_ms = 1000\n").unwrap();
    c.validate().unwrap();
    assert_eq!(
        (c.consensus.heartbeat_ms, c.consensus.primary_timeout_ms),
        (250, 1000)
    );
    let printed = c.to_toml_redacted();
    assert_eq!(parse(&printed).unwrap().consensus, c.consensus, "{printed}");
    let under_a_tick = parse("tick_ms = 10\n[consensus]\nheartbeat_ms = 5\n").unwrap();
    assert!(matches!(
        under_a_tick.validate(),
        Err(ConfigError::Invalid {
            field: "consensus.heartbeat_ms",
            ..
        })
    ));
    let too_short = parse("[consensus]\nheartbeat_ms = 500\nprimary_timeout_ms = 1499\n").unwrap();
    let err = too_short.validate().unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                field: "consensus.primary_timeout_ms",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("1500 ms"), "{err}");
    assert!(
        parse("[consensus]\nelection_ms = 1\n").is_err(),
        "unknown key"
    );
}

fn three_replicas() -> Config {
    let roster = DevArgs {
        replicas: 3,
        base_port: 9300,
    }
    .roster()
    .unwrap();
    let mut c = Config {
        replicas: roster.clone(),
        ..Config::default()
    };
    c.client.listen = roster[0].client_address;
    c.replica.listen = roster[0].replica_address;
    c
}

#[test]
fn given_a_roster_when_keyed_should_need_a_secret_of_32_bytes_from_the_environment_or_a_file() {
    let single = Config::default();
    assert_eq!(
        single.cluster_key(None),
        Ok(None),
        "a single replica needs none"
    );
    let mut c = three_replicas();
    c.validate().unwrap();
    match c.cluster_key(None) {
        Err(ConfigError::Invalid { field, reason }) => {
            assert_eq!(field, "replica.secret_file");
            assert!(reason.contains("REPLOG_CLUSTER_SECRET"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let secret = "0123456789abcdef0123456789abcdef";
    let from_env = c.cluster_key(Some(secret)).unwrap().unwrap();
    assert!(matches!(
        c.cluster_key(Some("too short")),
        Err(ConfigError::Invalid {
            field: "REPLOG_CLUSTER_SECRET",
            ..
        })
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    c.replica.secret_file = Some(file.clone());
    assert!(
        matches!(c.cluster_key(None), Err(ConfigError::Read { path, .. }) if path == file),
        "a missing file is named"
    );
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    assert_eq!(c.cluster_key(None).unwrap(), Some(from_env.clone()));
    let other = "fedcba9876543210fedcba9876543210";
    assert_ne!(
        c.cluster_key(Some(other)).unwrap(),
        Some(from_env),
        "the environment wins over the file"
    );
    std::fs::write(&file, "short").unwrap();
    let error = c.cluster_key(None).unwrap_err().to_string();
    assert!(
        error.contains("secret") && !error.contains("short"),
        "{error}"
    );
    let flagged = cli(&["--cluster-secret-file", "/etc/replog/secret"]);
    let mut d = Config::default();
    flagged.overrides.apply(&mut d);
    assert_eq!(
        d.replica.secret_file,
        Some(PathBuf::from("/etc/replog/secret"))
    );
}

#[test]
fn given_a_client_tls_section_when_validated_should_need_the_certificate_and_key_only_when_enabled()
{
    let c = Config::effective(&Overrides::default(), 1).unwrap();
    assert!(!c.client.tls.enabled, "off by default");
    let c = parse(
        "[client.tls]\nenabled = true\ncert_file = \"/etc/replog/server.pem\"\n\
         key_file = \"/etc/replog/server.key\"\nclient_ca_file = \"/etc/replog/ca.pem\"\n",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(
        c.client.tls.client_ca_file,
        Some(PathBuf::from("/etc/replog/ca.pem"))
    );
    let printed = c.to_toml_redacted();
    assert_eq!(
        parse(&printed).unwrap().client.tls,
        c.client.tls,
        "{printed}"
    );
    for (text, field) in [
        (
            "[client.tls]\nenabled = true\nkey_file = \"k.pem\"\n",
            "client.tls.cert_file",
        ),
        (
            "[client.tls]\nenabled = true\ncert_file = \"c.pem\"\n",
            "client.tls.key_file",
        ),
    ] {
        let err = parse(text).unwrap().validate().unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { field: f, .. } if *f == field),
            "{text}: {err}"
        );
    }
    parse("[client.tls]\ncert_file = \"c.pem\"\n")
        .unwrap()
        .validate()
        .unwrap();
    assert!(
        parse("[client.tls]\nenable = true\n").is_err(),
        "a misspelt key"
    );
}
