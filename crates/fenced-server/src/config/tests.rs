//! Tests of `config`.

use super::*;

#[test]
fn a_retired_setting_in_the_file_is_ignored_and_named_an_unknown_one_refused() {
    let c = Config::layered(Some("token_block = 1000\nttl_ms_max = 6000"), vec![], &[]).unwrap();
    assert_eq!((c.ignored_settings.as_slice(), c.ttl_ms_max), (&["token_block".to_string()][..], 6000));
    assert!(!c.to_toml().contains("token_block"), "not a setting any more");
    let e = Config::layered(Some("token_blok = 1000"), vec![], &[]).unwrap_err();
    assert!(e.to_string().contains("unknown setting 'token_blok'"), "{e}");
}

#[test]
fn precedence_flags_env_file_defaults() {
    let file = "listen = \"127.0.0.1:1\"\nttl_ms_max = 5000\nwait_ms_max = 7000\n";
    let env = vec![("FENCED_TTL_MS_MAX".to_string(), "6000".to_string()), ("OTHER".into(), "x".into())];
    let c = Config::layered(Some(file), env, &[("listen", "127.0.0.1:2".into())]).unwrap();
    assert_eq!(c.listen, "127.0.0.1:2");
    assert_eq!(c.wire_listen, None);
    let w = Config::layered(None, vec![("FENCED_WIRE_LISTEN".into(), "127.0.0.1:3".into())], &[]).unwrap();
    assert_eq!(w.wire_listen.as_deref(), Some("127.0.0.1:3"));
    assert_eq!(Config::layered(Some(&w.to_toml()), vec![], &[]).unwrap(), w);
    assert_eq!(c.ttl_ms_max, 6000);
    assert_eq!(c.wait_ms_max, 7000);
    assert_eq!(c.leases_max, Config::default().leases_max);
    assert!(!c.is_unfenced("anything"), "no key is unfenced by default");
    let env = vec![("FENCED_UNFENCED_PREFIX".to_string(), "scratch/".to_string())];
    let u = Config::layered(Some("unfenced_prefix = \"file/\""), env, &[]).unwrap();
    assert_eq!(u.unfenced_prefix, "scratch/");
    assert!(u.is_unfenced("scratch/x") && !u.is_unfenced("file/x"));
    let u = Config::layered(None, vec![], &[("unfenced_prefix", "flag/".into())]).unwrap();
    assert!(u.is_unfenced("flag/x"));
    let printed = Config::layered(Some(&c.to_toml()), vec![], &[]).unwrap();
    assert_eq!(printed, c);
}

#[test]
fn bad_configs_are_refused() {
    assert!(Config::layered(Some("nope = 1"), vec![], &[]).is_err());
    assert!(Config::layered(None, vec![("FENCED_LEASES_MAX".into(), "-1".into())], &[]).is_err());
    assert!(Config::layered(None, vec![], &[("tls_cert", "x".into())]).is_err());
    assert!(Config::layered(None, vec![], &[("lock_name_bytes_max", "300".into())]).is_err());
    assert!(Config::layered(None, vec![("FENCED_WORKER_THREADS".into(), "1025".into())], &[]).is_err());
}

#[test]
fn the_runtime_leaves_a_core_to_the_log_writer_unless_told() {
    let auto = crate::runtime_threads(&Config::default());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(auto, cores.saturating_sub(1).max(1));
    let set = Config::layered(None, vec![("FENCED_WORKER_THREADS".into(), "3".into())], &[]).unwrap();
    assert_eq!(crate::runtime_threads(&set), 3);
}

#[test]
fn peer_routes_are_parsed_like_peers_and_checked() {
    let c =
        Config::layered(Some("peer_routes = \"2=http://127.0.0.1:9/, 3=http://127.0.0.1:8\""), vec![], &[]).unwrap();
    let routes = c.routes().unwrap();
    assert_eq!(routes.get(&2).map(String::as_str), Some("http://127.0.0.1:9"));
    assert_eq!(routes.len(), 2);
    assert!(Config::default().routes().unwrap().is_empty());
    for bad in ["2=127.0.0.1:9", "x=http://a", "2=http://a,2=http://b"] {
        let e = Config::layered(None, vec![("FENCED_PEER_ROUTES".into(), bad.into())], &[]).unwrap_err();
        assert!(e.to_string().contains("peer_routes"), "{bad}: {e}");
    }
}
