use crate::{Activation, NoHost, Scope, Value, compile};

fn run(src: &str) -> Result<Value, String> {
    let p = compile(src, &Scope::new(["x"])).map_err(|e| format!("compile: {e}"))?;
    p.evaluate(&Activation::new(&NoHost))
        .map_err(|e| e.to_string())
}

fn assert_true(exprs: &[&str]) {
    for src in exprs {
        assert_eq!(run(src), Ok(Value::Bool(true)), "{src}");
    }
}

fn assert_err(exprs: &[(&str, &str)]) {
    for (src, needle) in exprs {
        match run(src) {
            Err(e) => assert!(e.contains(needle), "{src}: {e} lacks {needle:?}"),
            Ok(v) => panic!("{src}: expected an error, got {v:?}"),
        }
    }
}

#[test]
fn matches_uses_the_regex_cache() {
    assert_true(&[
        "'ghcr.io/acme/app'.matches('^ghcr\\\\.io/acme/.*')",
        "!'docker.io/x'.matches('^ghcr')",
        "matches('abc', 'b')",
        "['a1', 'b2'].all(s, s.matches('[a-z][0-9]'))",
    ]);
    assert_err(&[
        ("'a'.matches('(')", "not a valid regex"),
        ("'a'.matches(1)", "matches"),
    ]);
    let a = super::regex::compiled("^cache-test-[0-9]+$").unwrap();
    let b = super::regex::compiled("^cache-test-[0-9]+$").unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&a, &b),
        "second lookup must hit the cache"
    );
    assert!(super::regex::compiled("(").is_err());
}

#[test]
fn regex_find_and_find_all() {
    assert_true(&[
        "'abc 123 456'.find('[0-9]+') == '123'",
        "'abc'.find('[0-9]+') == ''",
        "'a1b2c3'.findAll('[0-9]') == ['1', '2', '3']",
        "'a1b2c3'.findAll('[0-9]', 2) == ['1', '2']",
        "'a1b2c3'.findAll('[0-9]', 0) == []",
        "'a1b2c3'.findAll('[0-9]', -1) == ['1', '2', '3']",
    ]);
    assert_err(&[
        ("'a'.find('[')", "not a valid regex"),
        ("'a'.findAll(1)", "findAll"),
    ]);
}

#[test]
fn strings_lists_math_encoders_extensions() {
    assert_true(&[
        "'hello'.charAt(1) == 'e' && 'hello'.indexOf('l') == 2 && 'hello'.lastIndexOf('l') == 3",
        "'  x '.trim() == 'x' && 'abc'.substring(1) == 'bc' && 'a-b'.replace('-', '+') == 'a+b'",
        "['a', 'b'].join(',') == 'a,b' && 'ABC'.lowerAscii() == 'abc' && 'abc'.upperAscii() == 'ABC'",
        "strings.quote('a\"b') == '\"a\\\\\"b\"'",
        "[1, 2, 2, 3].distinct() == [1, 2, 3] && [1, 2, 3].slice(1, 2) == [2] && lists.range(3) == [0, 1, 2]",
        "[3, 1].sortBy(e, e) == [1, 3] && [1, 2].reverse() == [2, 1]",
        "math.abs(-2) == 2 && math.ceil(1.2) == 2.0 && math.sign(-3) == -1",
        "base64.encode(b'hello') == 'aGVsbG8=' && string(base64.decode('aGVsbG8=')) == 'hello'",
    ]);
}

#[test]
fn sets_extension() {
    assert_true(&[
        "sets.contains([1, 2, 3], [3, 1])",
        "!sets.contains([1, 2], [4])",
        "sets.contains([1], [])",
        "sets.contains([1.0], [1])",
        "sets.equivalent(['a', 'b'], ['b', 'a', 'a'])",
        "!sets.equivalent([1], [1, 2])",
        "sets.intersects([1, 2], [2, 5])",
        "!sets.intersects([1], [])",
    ]);
    assert_err(&[("sets.contains(1, [1])", "sets.contains")]);
}

#[test]
fn url_library() {
    assert_true(&[
        "url('https://user@example.com:8443/a/b?x=1&x=2&y=').getScheme() == 'https'",
        "url('https://example.com:8443/a/b').getHost() == 'example.com:8443'",
        "url('https://example.com:8443/a/b').getHostname() == 'example.com'",
        "url('https://example.com:8443/a/b').getPort() == '8443'",
        "url('https://example.com').getPort() == ''",
        "url('https://[::1]:80/x').getHostname() == '::1'",
        "url('https://[::1]:80/x').getHost() == '[::1]:80'",
        "url('https://example.com/a%20b').getEscapedPath() == '/a%20b'",
        "url('https://e.com/?x=1&x=2&y=').getQuery() == {'x': ['1', '2'], 'y': ['']}",
        "url('/absolute/path').getScheme() == '' && url('/absolute/path').getEscapedPath() == '/absolute/path'",
        "isURL('https://example.com') && !isURL('example.com') && !isURL('') && !isURL('http://a b')",
        "url('https://a.com') == url('https://a.com')",
        "string(url('https://a.com/x')) == 'https://a.com/x'",
    ]);
    assert_err(&[
        ("url('not a url')", "URL parse error"),
        ("url('relative/path')", "URL parse error"),
        ("url(1)", "url"),
        ("'x'.getHost()", "getHost"),
    ]);
}

#[test]
fn ip_and_cidr_libraries() {
    assert_true(&[
        "ip('192.168.0.1').family() == 4 && ip('::1').family() == 6",
        "ip('127.0.0.1').isLoopback() && !ip('10.0.0.1').isLoopback()",
        "ip('0.0.0.0').isUnspecified() && ip('::').isUnspecified()",
        "ip('224.0.0.1').isLinkLocalMulticast() && ip('ff02::1').isLinkLocalMulticast()",
        "ip('169.254.1.1').isLinkLocalUnicast() && ip('fe80::1').isLinkLocalUnicast()",
        "ip('8.8.8.8').isGlobalUnicast() && !ip('255.255.255.255').isGlobalUnicast()",
        "ip('10.0.0.1') == ip('10.0.0.1') && ip('10.0.0.1') != ip('10.0.0.2')",
        "ip('2001:db8::1').string() == '2001:db8::1' && string(ip('1.2.3.4')) == '1.2.3.4'",
        "isIP('1.2.3.4') && !isIP('1.2.3') && !isIP('::ffff:1.2.3.4') && !isIP('fe80::1%eth0')",
        "ip.isCanonical('2001:db8::1') && !ip.isCanonical('2001:DB8::1')",
        "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3')) && cidr('10.0.0.0/8').containsIP('10.1.2.3')",
        "!cidr('10.0.0.0/8').containsIP('11.0.0.1') && !cidr('10.0.0.0/8').containsIP('::1')",
        "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16') && !cidr('10.1.0.0/16').containsCIDR(cidr('10.0.0.0/8'))",
        "cidr('192.168.0.1/24').ip() == ip('192.168.0.1')",
        "cidr('192.168.0.1/24').masked() == cidr('192.168.0.0/24')",
        "cidr('192.168.0.1/24').prefixLength() == 24 && cidr('::/0').prefixLength() == 0",
        "cidr('10.0.0.0/8').string() == '10.0.0.0/8'",
        "isCIDR('10.0.0.0/8') && !isCIDR('10.0.0.0') && !isCIDR('10.0.0.0/33')",
    ]);
    assert_err(&[
        ("ip('1.2.3')", "parse error"),
        ("ip('::ffff:1.2.3.4')", "IPv4-mapped"),
        ("ip('fe80::1%eth0')", "zone"),
        ("cidr('10.0.0.0/40')", "10.0.0.0/40"),
        ("cidr('10.0.0.0').prefixLength()", "prefix"),
        ("ip(1)", "ip"),
        ("'x'.family()", "family"),
        ("cidr('10.0.0.0/8').containsIP('nope')", "parse error"),
    ]);
}

#[test]
fn quantity_library() {
    assert_true(&[
        "quantity('1Gi').isGreaterThan(quantity('1G'))",
        "quantity('500m').isLessThan(quantity('1'))",
        "quantity('1k').compareTo(quantity('1000')) == 0 && quantity('1k') == quantity('1000')",
        "quantity('2').compareTo(quantity('1')) == 1 && quantity('1').compareTo(quantity('2')) == -1",
        "quantity('1Ki').asInteger() == 1024 && quantity('1.5Gi').asInteger() == 1610612736",
        "quantity('1e3').asInteger() == 1000 && quantity('1E-3').asApproximateFloat() == 0.001",
        "quantity('1.5').isInteger() == false && quantity('10').isInteger()",
        "quantity('0.5').asApproximateFloat() == 0.5",
        "quantity('-1').sign() == -1 && quantity('0').sign() == 0 && quantity('3m').sign() == 1",
        "quantity('1').add(quantity('500m')) == quantity('1500m') && quantity('1').add(2) == quantity('3')",
        "quantity('1').sub(quantity('500m')) == quantity('0.5') && quantity('5').sub(1).asInteger() == 4",
        "isQuantity('100Mi') && isQuantity('+1.5') && isQuantity('.5') && !isQuantity('1.2.3') && !isQuantity('10Gb') && !isQuantity('')",
        "quantity('1n').asApproximateFloat() > 0.0",
    ]);
    assert_err(&[
        (
            "quantity('1.5').asInteger()",
            "cannot convert value to integer",
        ),
        ("quantity('100Ei').asInteger()", "overflows"),
        ("quantity('abc')", "regular expression"),
        ("quantity('1e99999')", ""),
        ("quantity('1').add('x')", "add"),
    ]);
}

#[test]
fn semver_library() {
    assert_true(&[
        "semver('1.2.3').major() == 1 && semver('1.2.3').minor() == 2 && semver('1.2.3').patch() == 3",
        "semver('1.2.3').isLessThan(semver('1.10.0')) && semver('2.0.0').isGreaterThan(semver('1.9.9'))",
        "semver('1.0.0-alpha').isLessThan(semver('1.0.0'))",
        "semver('1.0.0+build1').compareTo(semver('1.0.0+build2')) == 0",
        "semver('1.2.3') == semver('1.2.3')",
        "isSemver('1.2.3') && !isSemver('v1.2.3') && !isSemver('1.2') && isSemver('v1.2', true)",
        "semver('v1.02', true) == semver('1.2.0') && string(semver('1.2.3-rc.1')) == '1.2.3-rc.1'",
    ]);
    assert_err(&[
        ("semver('1.2')", "semver"),
        ("semver('1.2.3').major(1)", "major"),
        ("semver('1.2.3').compareTo(quantity('1'))", "compareTo"),
    ]);
}

#[test]
fn kyverno_image_library() {
    let d = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";
    assert_true(&[
        "parseImageReference('nginx').registry() == 'index.docker.io'",
        "parseImageReference('nginx').repository() == 'library/nginx'",
        "parseImageReference('nginx').tag() == 'latest' && parseImageReference('nginx').identifier() == 'latest'",
        "image('ghcr.io/a/b:v1').registry() == 'ghcr.io' && image('ghcr.io/a/b:v1').tag() == 'v1'",
        "!image('ghcr.io/a/b:v1').containsDigest() && image('ghcr.io/a/b:v1').digest() == ''",
        "isImage('ghcr.io/a/b:v1') && !isImage('Not/Valid') && !isImage('')",
        "image('nginx') == image('nginx') && string(image('nginx')) == 'nginx'",
    ]);
    let digest_exprs = [
        format!("image('nginx:1@{d}').containsDigest()"),
        format!("image('nginx:1@{d}').digest() == '{d}'"),
        format!("image('nginx:1@{d}').tag() == ''"),
        format!("image('nginx:1@{d}').identifier() == '{d}'"),
    ];
    assert_true(&digest_exprs.iter().map(String::as_str).collect::<Vec<_>>());
    assert_err(&[
        ("parseImageReference('UPPER/case')", "UPPER/case"),
        ("image(1)", "image"),
        ("'nginx'.registry()", "registry"),
    ]);
}

#[test]
fn string_conversion_of_library_objects() {
    assert_true(&[
        "quantity('1Gi').string() == '1Gi'",
        "string(cidr('10.0.0.0/8')) == '10.0.0.0/8'",
    ]);
}

#[test]
fn kubernetes_lists_library() {
    assert_true(&[
        "[1, 2, 3].isSorted() && !['b', 'a'].isSorted() && [].isSorted()",
        "[1, 2, 3].sum() == 6 && [1.5, 2.0].sum() == 3.5 && [].sum() == 0",
        "[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3 && ['b', 'a'].min() == 'a'",
        "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1",
        "'abcb'.indexOf('b') == 1 && 'abcb'.lastIndexOf('b') == 3",
        "jsonpatch.escapeKey('a/b~c') == 'a~1b~0c'",
    ]);
    assert_err(&[
        ("[].min()", "empty list"),
        ("[9223372036854775807, 1].sum()", "overflow"),
        ("[1, 'a'].isSorted()", "not comparable"),
        ("['a'].sum()", "sum"),
    ]);
}

#[test]
fn cel_bind_macro() {
    assert_true(&[
        "cel.bind(x, 2, x * x) == 4",
        "cel.bind(a, [1, 2], cel.bind(b, a.size(), b + a[0])) == 3",
    ]);
    assert!(compile("cel.bind(1, 2, 3)", &Scope::new(["x"])).is_err());
    // the binding is only visible inside the body
    assert!(compile("cel.bind(y, 1, y) + y", &Scope::new(["x"])).is_err());
}

/// A host whose wall clock reads a fixed time.
struct FixedClock(std::time::SystemTime);

impl crate::Host for FixedClock {
    fn verify_image_signatures(
        &self,
        _: &str,
        _: &[serde_json::Value],
    ) -> Result<i64, crate::HostError> {
        Err(crate::HostError::NotAvailable)
    }
    fn verify_attestation_signatures(
        &self,
        _: &str,
        _: &str,
        _: &[serde_json::Value],
    ) -> Result<i64, crate::HostError> {
        Err(crate::HostError::NotAvailable)
    }
    fn extract_payload(&self, _: &str, _: &str) -> Result<serde_json::Value, crate::HostError> {
        Err(crate::HostError::NotAvailable)
    }
    fn image_data(&self, _: &str) -> Result<serde_json::Value, crate::HostError> {
        Err(crate::HostError::NotAvailable)
    }
    fn wall_time(&self) -> std::time::SystemTime {
        self.0
    }
}

#[test]
fn time_now_reads_the_hosts_wall_clock() {
    // 2025-01-02T03:45:27Z
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_735_789_527);
    let host = FixedClock(at);
    for src in [
        "time.now() == timestamp('2025-01-02T03:45:27Z')",
        "time.now() - timestamp('2024-12-26T03:45:27Z') == duration('168h')",
        "time.now() - duration('3h') < time.now()",
        "time.toCron(time.now()) == '45 3 2 1 4'",
    ] {
        let p = compile(src, &Scope::new(["x"])).unwrap_or_else(|e| panic!("{src}: {e}"));
        assert_eq!(
            p.evaluate(&Activation::new(&host)),
            Ok(Value::Bool(true)),
            "{src}"
        );
    }
    // Without a fixed clock it is the system's: after the date this test was written.
    assert_true(&["time.now() > timestamp('2026-12-01T00:00:00Z')"]);
    assert_err(&[("time.now(1)", "time.now"), ("'x'.now()", "now")]);
}

/// Expected values are Go's `time.Truncate` and Kyverno's `time.toCron` (which reads Go's
/// `Minute`, `Hour`, `Day`, `Month`, `Weekday`) on the same inputs.
#[test]
fn time_truncate_and_to_cron_follow_go() {
    assert_true(&[
        "time.truncate(timestamp('2025-01-02T03:45:27Z'), duration('1h')) == timestamp('2025-01-02T03:00:00Z')",
        // Counted from Go's zero time, not the Unix epoch (which would give 23:20).
        "time.truncate(timestamp('2025-01-02T03:45:27Z'), duration('7h')) == timestamp('2025-01-01T22:00:00Z')",
        "time.truncate(timestamp('2025-01-02T03:45:27.123456789+05:30'), duration('1h')) == timestamp('2025-01-02T03:30:00+05:30')",
        "time.truncate(timestamp('2025-01-02T03:45:27.123456789+05:30'), duration('7h13m')) == timestamp('2025-01-02T02:36:00+05:30')",
        "time.truncate(timestamp('1969-12-31T23:59:59.5Z'), duration('1s')) == timestamp('1969-12-31T23:59:59Z')",
        "time.truncate(timestamp('2025-01-02T03:45:27Z'), duration('-1h')) == timestamp('2025-01-02T03:45:27Z')",
        "time.toCron(timestamp('2025-01-02T03:45:27.123456789+05:30')) == '45 3 2 1 4'",
        "time.toCron(timestamp('1969-12-31T23:59:59.5Z')) == '59 23 31 12 3'",
    ]);
    assert_err(&[
        ("time.truncate('2025', duration('1h'))", "time.truncate"),
        ("time.toCron(1)", "time.toCron"),
    ]);
}
