//! Every fixture of issue 5 served from a loopback server, through the download handler:
//! each gives its documented output or its documented failure. No test dials beyond loopback:
//! the client's dial check refuses and records any other address, and each test asserts it
//! recorded none.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::*;
use imagepipe_blob::{BlobKey, BlobStore};
use imagepipe_contracts::ImageSource;
use imagepipe_download_worker::DownloadError;
use imagepipe_net::testing::{FixtureServer, Route};
use imagepipe_net::{Limits, StaticResolver};

fn url(source: &str) -> ImageSource {
    ImageSource::Url(source.to_owned())
}

#[tokio::test]
async fn images_are_stored_by_content_address_with_their_sniffed_format() {
    let fixtures: Vec<(&'static str, Vec<u8>, &str)> = vec![
        ("/photo.jpg", jpeg_with_exif_and_gps(), "jpeg"),
        ("/alpha.png", png_with_alpha(), "png"),
        ("/animated.gif", animated_gif(), "gif"),
        ("/image.webp", webp(), "webp"),
        ("/image.bmp", bmp(), "bmp"),
        ("/image.tiff", tiff(), "tiff"),
        // Still a JPEG by its magic bytes; decoding it fails later, in the metadata worker.
        ("/truncated.jpg", truncated_jpeg(), "jpeg"),
        // Tiny file, huge dimensions: a PNG here; the metadata worker's pixel limit stops it.
        ("/bomb.png", pixel_bomb_png(), "png"),
    ];
    // Content-Type is deliberately wrong everywhere: only the bytes count.
    let routes = fixtures.iter().map(|(path, bytes, _)| (*path, Route::ok("text/plain", bytes.clone())));
    let server = FixtureServer::start(routes).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (handler, blobs, dial) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), Limits::default()).await;

    for (path, bytes, format) in &fixtures {
        let output = handler.download(&url(&server.url(path))).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        let key = BlobKey::of(bytes);
        assert_eq!(output.blob_key, key.as_str(), "{path}");
        assert_eq!(output.sha256, key.hex(), "{path}");
        assert_eq!((output.size, output.format.as_str()), (bytes.len() as u64, *format), "{path}");
        assert_eq!(output.final_url.as_deref(), Some(server.url(path).as_str()), "{path}");
        assert_eq!(&blobs.get(&key).await.unwrap()[..], &bytes[..], "{path}: stored byte for byte");
    }
    let exif = jpeg_with_exif_and_gps();
    assert!(exif.windows(6).any(|w| w == b"Exif\0\0"), "the JPEG fixture carries EXIF");
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn a_text_file_sent_as_jpeg_is_not_an_image() {
    let server = FixtureServer::start([
        ("/fake.jpg", Route::ok("image/jpeg", "this is a text file, whatever the header says\n")),
        ("/page.jpg", Route::ok("image/jpeg", "<!DOCTYPE html><html><body>login</body></html>")),
        ("/empty.jpg", Route::ok("image/jpeg", "")),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (handler, _, _) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), Limits::default()).await;
    for (path, detected) in [("/fake.jpg", "text"), ("/page.jpg", "html"), ("/empty.jpg", "empty")] {
        let error = handler.download(&url(&server.url(path))).await.unwrap_err();
        assert!(!error.is_retryable(), "{path}");
        let step = error.to_step_error();
        assert_eq!(step.code, "not_an_image", "{path}");
        assert_eq!(step.message, format!("not an image (detected: {detected})"), "{path}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was stored");
}

#[tokio::test]
async fn missing_gone_and_forbidden_are_permanent() {
    let server =
        FixtureServer::start([("/gone", Route::status(410)), ("/forbidden", Route::status(403))]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (handler, _, _) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), Limits::default()).await;
    for (path, code) in [("/missing", "http_404"), ("/gone", "http_410"), ("/forbidden", "http_403")] {
        let error = handler.download(&url(&server.url(path))).await.unwrap_err();
        assert_eq!((error.code().as_str(), error.is_retryable()), (code, false), "{path}");
    }
}

#[tokio::test]
async fn a_503_is_retryable_no_sooner_than_its_retry_after() {
    let date = httpdate_in(Duration::from_secs(90));
    let server = FixtureServer::start([
        ("/busy", Route::with_headers(503, &[("Retry-After", "120")])),
        ("/busy-until", Route::with_headers(503, &[("Retry-After", &date)])),
        ("/down", Route::status(502)),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (handler, _, _) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), Limits::default()).await;

    let error = handler.download(&url(&server.url("/busy"))).await.unwrap_err();
    assert_eq!((error.code().as_str(), error.is_retryable()), ("http_503", true));
    assert_eq!(error.retry_after(), Some(Duration::from_secs(120)));

    let error = handler.download(&url(&server.url("/busy-until"))).await.unwrap_err();
    let delay = error.retry_after().expect("an HTTP date is honoured");
    assert!((Duration::from_secs(85)..=Duration::from_secs(90)).contains(&delay), "{delay:?}");

    let error = handler.download(&url(&server.url("/down"))).await.unwrap_err();
    assert_eq!((error.code().as_str(), error.is_retryable(), error.retry_after()), ("http_502", true, None));
}

fn httpdate_in(delay: Duration) -> String {
    // RFC 7231 IMF-fixdate, computed without a date crate: days since the epoch → civil date.
    let secs = (std::time::SystemTime::now() + delay).duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let names = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!(
        "{weekday}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        names[(month - 1) as usize],
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[tokio::test]
async fn a_slow_drip_times_out_and_is_retryable() {
    // A byte every 50 ms is never silent for the read timeout: the total timeout ends it.
    let server =
        FixtureServer::start([("/drip.jpg", Route::Drip { declared: 10_000_000, every: Duration::from_millis(50) })])
            .await
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        read_timeout: Duration::from_millis(250),
        total_timeout: Duration::from_millis(600),
        ..Limits::default()
    };
    let (handler, _, dial) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), limits).await;
    let started = Instant::now();
    let error = handler.download(&url(&server.url("/drip.jpg"))).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!((error.code().as_str(), error.is_retryable()), ("timeout", true), "{error}");
    assert!(error.to_string().contains("Total timeout"), "{error}");
    assert!((limits.total_timeout..Duration::from_secs(5)).contains(&took), "{took:?}");
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn a_server_that_never_sends_headers_times_out_after_the_read_timeout() {
    let server = FixtureServer::start([("/hang.jpg", Route::Silent)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { read_timeout: Duration::from_millis(300), ..Limits::default() };
    let (handler, _, dial) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), limits).await;
    let started = Instant::now();
    let error = handler.download(&url(&server.url("/hang.jpg"))).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!((error.code().as_str(), error.is_retryable()), ("timeout", true), "{error}");
    assert!(error.to_string().contains("Read timeout"), "{error}");
    // The total timeout (20 s by default) is far off: only the read timeout can end it this soon.
    assert!((limits.read_timeout..Duration::from_secs(3)).contains(&took), "{took:?}");
    assert_eq!(server.requests().len(), 1, "the server got the request and never answered");
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn urls_in_errors_show_no_credentials_or_query() {
    let server = FixtureServer::start([("/busy.jpg", Route::status(503))]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (handler, _, _) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), Limits::default()).await;
    let port = server.addr().port();
    let secret = format!("http://alice:hunter2@127.0.0.1:{port}/busy.jpg?X-Amz-Signature=s3cr3t#frag");
    let refused = "http://alice:hunter2@10.0.0.1/a.jpg?token=s3cr3t";
    for (source, shown) in [(secret.as_str(), server.url("/busy.jpg")), (refused, "http://10.0.0.1/a.jpg".into())] {
        let message = handler.download(&url(source)).await.unwrap_err().to_step_error().message;
        assert!(message.starts_with(&format!("{shown}: ")), "{message}");
        for leak in ["alice", "hunter2", "s3cr3t", "Signature", "token", "frag"] {
            assert!(!message.contains(leak), "{leak} in {message}");
        }
    }
}

#[tokio::test]
async fn an_oversize_body_is_cut_off_mid_stream_and_is_permanent() {
    let mut jpeg_start = jpeg_with_exif_and_gps();
    jpeg_start.resize(64 * 1024, 0);
    let server = FixtureServer::start([
        ("/endless.jpg", Route::Endless { chunk: jpeg_start.into() }),
        ("/big.png", Route::ok("image/png", vec![0x89; 300_000])),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { max_bytes: 256 * 1024, ..Limits::default() };
    let (handler, _, _) = handler(dir.path(), &[LOOPBACK], StaticResolver::new(), limits).await;
    for path in ["/endless.jpg", "/big.png"] {
        let error = handler.download(&url(&server.url(path))).await.unwrap_err();
        assert_eq!((error.code().as_str(), error.is_retryable()), ("too_large", false), "{path}: {error}");
    }
}

#[tokio::test]
async fn redirects_to_loopback_and_to_the_metadata_endpoint_are_refused_before_connecting() {
    let internal = FixtureServer::start([("/admin.png", Route::ok("image/png", png_with_alpha()))]).await.unwrap();
    // The entry server stands for a public site: only its own address (127.0.0.2) is allowed.
    let entry = FixtureServer::start_on(
        Ipv4Addr::new(127, 0, 0, 2),
        [
            ("/to-loopback", Route::redirect(&internal.url("/admin.png"))),
            ("/to-metadata", Route::redirect("http://169.254.169.254/latest/meta-data/iam/security-credentials/")),
            ("/to-metadata-name", Route::redirect("http://metadata.test/computeMetadata/v1/")),
            ("/to-ftp", Route::redirect("ftp://127.0.0.2/image.png")),
        ],
    )
    .await
    .unwrap();
    let resolver = StaticResolver::new().with("metadata.test", [IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254))]);
    let dir = tempfile::tempdir().unwrap();
    let (handler, _, dial) = handler(dir.path(), &["127.0.0.2/32"], resolver, Limits::default()).await;

    for (path, code) in [
        ("/to-loopback", "address_refused"),
        ("/to-metadata", "address_refused"),
        ("/to-metadata-name", "address_refused"),
        ("/to-ftp", "invalid_url"),
    ] {
        let error = handler.download(&url(&entry.url(path))).await.unwrap_err();
        assert_eq!((error.code().as_str(), error.is_retryable()), (code, false), "{path}: {error}");
    }
    let error = handler.download(&url(&entry.url("/to-loopback"))).await.unwrap_err();
    assert!(error.to_string().contains("127.0.0.1") && error.to_string().contains("loopback"), "{error}");
    assert!(internal.requests().is_empty(), "the loopback target was never contacted");
    assert!(dial.violations().is_empty(), "refused before any dial: {:?}", dial.violations());
}

#[tokio::test]
async fn direct_ssrf_targets_are_refused() {
    let resolver = StaticResolver::new()
        .with("evil.test", [IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254))])
        .with("intranet.test", [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))]);
    let dir = tempfile::tempdir().unwrap();
    let (handler, _, dial) = handler(dir.path(), &[], resolver, Limits::default()).await;
    for target in [
        "http://evil.test/latest/meta-data/",
        "http://intranet.test/photo.jpg",
        "http://127.0.0.1/photo.jpg",
        "http://[::1]/photo.jpg",
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://100.100.100.200/latest/meta-data/",
        "http://192.168.1.1/",
    ] {
        let error = handler.download(&url(target)).await.unwrap_err();
        assert_eq!(error.code(), "address_refused", "{target}: {error}");
    }
    assert!(dial.violations().is_empty());
}

#[tokio::test]
async fn an_uploaded_blob_is_validated_without_http() {
    let dir = tempfile::tempdir().unwrap();
    let (handler, blobs, _) = handler(dir.path(), &[], StaticResolver::new(), Limits::default()).await;
    let png = png_with_alpha();
    let key = blobs.put(png.clone().into()).await.unwrap();
    let output = handler.download(&ImageSource::Blob(key.to_string())).await.unwrap();
    assert_eq!((output.blob_key.as_str(), output.format.as_str()), (key.as_str(), "png"));
    assert_eq!((output.size, output.final_url), (png.len() as u64, None));

    let text = blobs.put("plain text upload".into()).await.unwrap();
    let error = handler.download(&ImageSource::Blob(text.to_string())).await.unwrap_err();
    assert_eq!(error.to_step_error().message, "not an image (detected: text)");

    let missing = BlobKey::of(b"never stored");
    let error = handler.download(&ImageSource::Blob(missing.to_string())).await.unwrap_err();
    assert_eq!((error.code().as_str(), error.is_retryable()), ("blob_not_found", false));

    let error = handler.download(&ImageSource::Blob("sha256:nothex".into())).await.unwrap_err();
    assert!(matches!(error, DownloadError::InvalidBlobKey(_)), "{error:?}");
}

#[tokio::test]
async fn an_uploaded_blob_over_the_limit_is_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { max_bytes: 100, ..Limits::default() };
    let (handler, blobs, _) = handler(dir.path(), &[], StaticResolver::new(), limits).await;
    let key = blobs.put(png_with_alpha().into()).await.unwrap();
    let error = handler.download(&ImageSource::Blob(key.to_string())).await.unwrap_err();
    assert_eq!((error.code().as_str(), error.is_retryable()), ("too_large", false));
}
