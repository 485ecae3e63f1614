//! The address policy: one pure function deciding whether an outbound client may connect to an IP.
//!
//! Refused: loopback, private (RFC 1918, ULA, deprecated site-local), link-local, shared address
//! space (CGNAT), multicast, unspecified, broadcast and other reserved ranges, documentation and
//! benchmarking ranges, and cloud metadata endpoints. IPv6 forms that carry an IPv4 address
//! (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) are judged by the address they carry.
//!
//! An allowlist of CIDRs (`net.allow_cidrs`) overrides the policy, except that a metadata endpoint
//! is reachable only through an allowlist entry naming that single address (`/32` or `/128`), so a
//! broad entry such as `169.254.0.0/16` never exposes instance credentials by accident.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Blocked {
    /// A cloud instance metadata endpoint (169.254.169.254, fd00:ec2::254, 100.100.100.200, ...).
    Metadata,
    /// Loopback (127.0.0.0/8, ::1).
    Loopback,
    /// Private networks (10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10, 64:ff9b:1::/48).
    Private,
    /// Link-local (169.254/16, fe80::/10).
    LinkLocal,
    /// Shared address space for carrier-grade NAT (100.64/10).
    SharedCgnat,
    /// Multicast (224/4, ff00::/8).
    Multicast,
    /// Unspecified or "this network" (0.0.0.0/8, ::).
    Unspecified,
    /// Limited broadcast (255.255.255.255).
    Broadcast,
    /// Documentation ranges (192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20).
    Documentation,
    /// Benchmarking ranges (198.18/15, 2001:2::/48).
    Benchmarking,
    /// Other special-purpose or reserved ranges (240/4, 192.0.0/24, 100::/64, ...).
    Reserved,
}

impl Blocked {
    /// A stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Blocked::Metadata => "metadata",
            Blocked::Loopback => "loopback",
            Blocked::Private => "private",
            Blocked::LinkLocal => "link_local",
            Blocked::SharedCgnat => "shared_cgnat",
            Blocked::Multicast => "multicast",
            Blocked::Unspecified => "unspecified",
            Blocked::Broadcast => "broadcast",
            Blocked::Documentation => "documentation",
            Blocked::Benchmarking => "benchmarking",
            Blocked::Reserved => "reserved",
        }
    }
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Blocked::Metadata => "a cloud metadata endpoint",
            Blocked::Loopback => "a loopback address",
            Blocked::Private => "a private address",
            Blocked::LinkLocal => "a link-local address",
            Blocked::SharedCgnat => "a shared (CGNAT) address",
            Blocked::Multicast => "a multicast address",
            Blocked::Unspecified => "an unspecified address",
            Blocked::Broadcast => "the broadcast address",
            Blocked::Documentation => "a documentation address",
            Blocked::Benchmarking => "a benchmarking address",
            Blocked::Reserved => "a reserved address",
        };
        f.write_str(text)
    }
}

/// Metadata endpoints of the major clouds.
const METADATA_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(169, 254, 169, 254), // AWS, GCP, Azure, DigitalOcean, OpenStack
    Ipv4Addr::new(169, 254, 170, 2),   // AWS ECS task metadata
    Ipv4Addr::new(100, 100, 100, 200), // Alibaba Cloud
    Ipv4Addr::new(192, 0, 0, 192),     // Oracle Cloud
];
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)]; // AWS

/// Whether `ip` may be reached, given the allowlist `allow`.
pub fn check(ip: IpAddr, allow: &[IpNet]) -> Result<(), Blocked> {
    let Err(blocked) = classify(ip) else { return Ok(()) };
    let allowed = if blocked == Blocked::Metadata {
        allow.iter().any(|net| net.prefix_len() == net.max_prefix_len() && net.contains(&ip))
    } else {
        let carried = carried_ipv4(ip).map(IpAddr::V4);
        allow.iter().any(|net| net.contains(&ip) || carried.is_some_and(|v4| net.contains(&v4)))
    };
    if allowed { Ok(()) } else { Err(blocked) }
}

/// Whether `ip` is a public unicast address, ignoring any allowlist.
pub fn classify(ip: IpAddr) -> Result<(), Blocked> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Result<(), Blocked> {
    if METADATA_V4.contains(&ip) {
        return Err(Blocked::Metadata);
    }
    let [a, b, c, _] = ip.octets();
    let blocked = match (a, b, c) {
        _ if ip == Ipv4Addr::BROADCAST => Blocked::Broadcast,
        (0, ..) => Blocked::Unspecified,
        (10, ..) => Blocked::Private,
        (100, 64..=127, _) => Blocked::SharedCgnat,
        (127, ..) => Blocked::Loopback,
        (169, 254, _) => Blocked::LinkLocal,
        (172, 16..=31, _) => Blocked::Private,
        (192, 0, 0) => Blocked::Reserved,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Blocked::Documentation,
        (192, 88, 99) => Blocked::Reserved,
        (192, 168, _) => Blocked::Private,
        (198, 18..=19, _) => Blocked::Benchmarking,
        (224..=239, ..) => Blocked::Multicast,
        (240..=255, ..) => Blocked::Reserved,
        _ => return Ok(()),
    };
    Err(blocked)
}

fn classify_v6(ip: Ipv6Addr) -> Result<(), Blocked> {
    if METADATA_V6.contains(&ip) {
        return Err(Blocked::Metadata);
    }
    if ip.is_unspecified() {
        return Err(Blocked::Unspecified);
    }
    if ip.is_loopback() {
        return Err(Blocked::Loopback);
    }
    if let Some(v4) = carried_ipv4(IpAddr::V6(ip)) {
        return classify_v4(v4);
    }
    let s = ip.segments();
    let blocked = match s {
        [0x0064, 0xff9b, 0x0001, ..] => Blocked::Private, // local-use NAT64 (RFC 8215)
        [0x0100, 0, 0, 0, ..] => Blocked::Reserved,       // discard-only (RFC 6666)
        [0x2001, 0x0002, 0, ..] => Blocked::Benchmarking,
        [0x2001, 0x0db8, ..] => Blocked::Documentation,
        [0x2001, 0x0010..=0x002f, ..] => Blocked::Reserved, // ORCHID and ORCHIDv2
        [0x3fff, y, ..] if y & 0xf000 == 0 => Blocked::Documentation,
        [x, ..] if x & 0xfe00 == 0xfc00 => Blocked::Private,
        [x, ..] if x & 0xffc0 == 0xfe80 => Blocked::LinkLocal,
        [x, ..] if x & 0xffc0 == 0xfec0 => Blocked::Private, // deprecated site-local
        [x, ..] if x & 0xff00 == 0xff00 => Blocked::Multicast,
        [0, ..] => Blocked::Reserved, // the rest of ::/8 (reserved by IETF)
        _ => return Ok(()),
    };
    Err(blocked)
}

/// The IPv4 address an IPv6 address carries, if it is one of the forms that tunnel or translate
/// to IPv4: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`),
/// 6to4 (`2002::/16`) or Teredo (`2001::/32`, the client address).
pub fn carried_ipv4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let s = v6.segments();
    let from = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(from(hi, lo)),
        [0, 0, 0, 0, 0, 0, hi, lo] if !v6.is_unspecified() && !v6.is_loopback() => Some(from(hi, lo)),
        [0x0064, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(from(hi, lo)),
        [0x2002, hi, lo, ..] => Some(from(hi, lo)),
        [0x2001, 0, .., hi, lo] => Some(from(!hi, !lo)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn every_special_range_is_refused() {
        use Blocked::*;
        let table: &[(&str, Blocked)] = &[
            // IPv4
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("10.0.0.1", Private),
            ("10.255.255.255", Private),
            ("100.64.0.1", SharedCgnat),
            ("100.127.255.254", SharedCgnat),
            ("100.100.100.200", Metadata),
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("169.254.0.1", LinkLocal),
            ("169.254.169.254", Metadata),
            ("169.254.170.2", Metadata),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.0.0.8", Reserved),
            ("192.0.0.192", Metadata),
            ("192.0.2.1", Documentation),
            ("192.88.99.1", Reserved),
            ("192.168.1.1", Private),
            ("198.18.0.1", Benchmarking),
            ("198.19.255.255", Benchmarking),
            ("198.51.100.7", Documentation),
            ("203.0.113.9", Documentation),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("240.0.0.1", Reserved),
            ("255.255.255.254", Reserved),
            ("255.255.255.255", Broadcast),
            // IPv6
            ("::", Unspecified),
            ("::1", Loopback),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("fd00:ec2::254", Metadata),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("fec0::1", Private),
            ("ff02::1", Multicast),
            ("ff0e::1", Multicast),
            ("2001:db8::1", Documentation),
            ("3fff::1", Documentation),
            ("3fff:fff::1", Documentation),
            ("2001:2::1", Benchmarking),
            ("2001:10::1", Reserved),
            ("100::1", Reserved),
            ("64:ff9b:1::1", Private),
            ("::2:0:0:1", Reserved),
            // IPv6 forms carrying a refused IPv4 address
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:169.254.169.254", Metadata),
            ("::ffff:10.1.2.3", Private),
            ("::ffff:0.0.0.0", Unspecified),
            ("::127.0.0.1", Loopback),
            ("::192.168.0.1", Private),
            ("64:ff9b::a9fe:a9fe", Metadata),
            ("64:ff9b::7f00:1", Loopback),
            ("2002:7f00:1::", Loopback),
            ("2002:a9fe:a9fe::1", Metadata),
            ("2002:c0a8:101::", Private),
            ("2001:0:4136:e378:8000:63bf:f5ff:fffe", Private), // Teredo client 10.0.0.1
        ];
        for &(addr, expected) in table {
            assert_eq!(check(ip(addr), &[]), Err(expected), "{addr}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "3fff:1000::1",
            "2a00:1450:4001:81b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:0:4136:e378:8000:63bf:f7f7:f7f7", // Teredo client 8.8.8.8
        ] {
            assert_eq!(check(ip(addr), &[]), Ok(()), "{addr}");
        }
    }

    #[test]
    fn the_allowlist_opens_exactly_its_networks() {
        let allow = nets(&["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]);
        assert_eq!(check(ip("127.0.0.1"), &allow), Ok(()));
        assert_eq!(check(ip("::ffff:127.0.0.1"), &allow), Ok(()), "a mapped form of an allowed address");
        assert_eq!(check(ip("127.0.0.2"), &allow), Err(Blocked::Loopback));
        assert_eq!(check(ip("::1"), &allow), Err(Blocked::Loopback));
        assert_eq!(check(ip("10.9.8.7"), &allow), Ok(()));
        assert_eq!(check(ip("192.168.0.1"), &allow), Err(Blocked::Private));
        assert_eq!(check(ip("fd12::1"), &allow), Ok(()));
        assert_eq!(check(ip("fc00::1"), &allow), Err(Blocked::Private));
    }

    #[test]
    fn metadata_endpoints_need_an_allowlist_entry_of_their_own() {
        let broad = nets(&["169.254.0.0/16", "fd00::/8", "100.64.0.0/10"]);
        for addr in ["169.254.169.254", "fd00:ec2::254", "100.100.100.200", "::ffff:169.254.169.254"] {
            assert_eq!(check(ip(addr), &broad), Err(Blocked::Metadata), "{addr}");
        }
        assert_eq!(check(ip("169.254.1.1"), &broad), Ok(()));
        let exact = nets(&["169.254.169.254/32"]);
        assert_eq!(check(ip("169.254.169.254"), &exact), Ok(()));
    }

    #[test]
    fn carried_ipv4_reads_every_tunnel_form() {
        let v4 = Ipv4Addr::new(192, 0, 2, 33);
        for addr in ["::ffff:192.0.2.33", "::192.0.2.33", "64:ff9b::192.0.2.33", "2002:c000:221::"] {
            assert_eq!(carried_ipv4(ip(addr)), Some(v4), "{addr}");
        }
        assert_eq!(carried_ipv4(ip("2001:0:4136:e378:8000:63bf:3fff:fdde")), Some(v4), "Teredo");
        assert_eq!(carried_ipv4(ip("2606:4700::1")), None);
        assert_eq!(carried_ipv4(ip("192.0.2.33")), None);
    }
}
