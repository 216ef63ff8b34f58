//! `AMPCCL_SOCKET_IFNAME`: which network interface a rank listens on, in NCCL's syntax
//! (`NCCL_SOCKET_IFNAME`): a comma-separated list of interface-name prefixes (`eth,ib`), `^` in
//! front to exclude them instead (`^docker,lo`), `=` in front to match whole names only
//! (`=eth0`, `^=eth0`).
//!
//! Without it a rank listens on the interface that routes to the rendezvous root, which the
//! other ranks reach the same way; and a unique id's root, which has no root to route to,
//! listens on [`default_address`]: as NCCL, the first InfiniBand interface, else the first
//! other one that is neither loopback nor a container bridge, loopback only when nothing
//! else is up (so an id made on one host works on every host that can reach it).

use std::net::IpAddr;

use ampccl_runtime::{Error, Result};

/// The variable.
pub const VAR: &str = "AMPCCL_SOCKET_IFNAME";

/// A parsed `AMPCCL_SOCKET_IFNAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfaceFilter {
    /// Parses NCCL's syntax (an empty list is an error: it would match nothing or everything).
    pub fn parse(spec: &str) -> Result<IfaceFilter> {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        rest = rest.trim_start_matches('^');
        let exact = rest.starts_with('=');
        rest = rest.trim_start_matches('=');
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{VAR}={spec:?}: expected interface names or prefixes, e.g. eth0 or ^docker,lo"
            )));
        }
        Ok(IfaceFilter {
            exclude,
            exact,
            names,
        })
    }

    /// Whether the interface `name` passes.
    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }

    /// The address to listen on among `ifaces` (name, address): the first IPv4 address of a
    /// matching interface, else the first IPv6 one; loopback only where the filter names it.
    pub fn pick(&self, ifaces: &[(String, IpAddr)]) -> Result<IpAddr> {
        let ok = |(name, ip): &&(String, IpAddr)| {
            self.matches(name) && (!ip.is_loopback() || (!self.exclude && self.names_loopback()))
        };
        let found = ifaces.iter().filter(ok);
        let (v4, v6): (Vec<_>, Vec<_>) = found.partition(|(_, ip)| ip.is_ipv4());
        v4.first().or(v6.first()).map(|(_, ip)| *ip).ok_or_else(|| {
            let names: Vec<&str> = ifaces.iter().map(|(n, _)| n.as_str()).collect();
            Error::InvalidArgument(format!(
                "{VAR}: no interface with an address matches {:?} (interfaces: {})",
                self.names,
                names.join(", ")
            ))
        })
    }

    /// Whether the filter asks for a loopback interface by name.
    fn names_loopback(&self) -> bool {
        self.names.iter().any(|n| n.starts_with("lo"))
    }
}

/// The address a unique id's root listens on without `AMPCCL_SOCKET_IFNAME` (see the module
/// documentation): among `ifaces`, `ib*` interfaces first, then any but `lo*`, `docker*` and
/// `virbr*`; IPv4 before IPv6; IPv6 link-local addresses (which need a scope) never;
/// loopback when nothing else qualifies.
pub fn default_address(ifaces: &[(String, IpAddr)]) -> IpAddr {
    let usable = |(name, ip): &&(String, IpAddr)| {
        let link_local = matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
        !ip.is_loopback()
            && !link_local
            && !["lo", "docker", "virbr"]
                .iter()
                .any(|p| name.starts_with(p))
    };
    let rank = |(name, ip): &&(String, IpAddr)| (!name.starts_with("ib"), !ip.is_ipv4());
    ifaces
        .iter()
        .filter(usable)
        .min_by_key(rank)
        .map(|(_, ip)| *ip)
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// The filter `AMPCCL_SOCKET_IFNAME` sets, if any.
pub fn from_env() -> Result<Option<IfaceFilter>> {
    match std::env::var(VAR) {
        Ok(v) if !v.trim().is_empty() => IfaceFilter::parse(&v).map(Some),
        _ => Ok(None),
    }
}

/// Every (interface name, address) of this host's network namespace whose interface is up,
/// IPv4 and IPv6.
pub fn interfaces() -> Result<Vec<(String, IpAddr)>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` fills `list` with a linked list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(Error::system("getifaddrs", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list `getifaddrs` returned, not freed yet.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let up = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() || ifa.ifa_flags & up != up {
            continue;
        }
        // SAFETY: a non-null `ifa_name` is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `ifa_addr` is non-null and points to a sockaddr of the family it names,
        // sockaddr_in for AF_INET and sockaddr_in6 for AF_INET6.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let a = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    Some(IpAddr::from(a.sin_addr.s_addr.to_ne_bytes()))
                }
                libc::AF_INET6 => {
                    let a = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    Some(IpAddr::from(a.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        out.extend(ip.map(|ip| (name, ip)));
    }
    // SAFETY: the list came from `getifaddrs` and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifaces() -> Vec<(String, IpAddr)> {
        [
            ("lo", "127.0.0.1"),
            ("docker0", "172.17.0.1"),
            ("eth0", "fe80::1"),
            ("eth0", "10.0.0.5"),
            ("eth10", "10.1.0.5"),
            ("ib0", "192.168.7.2"),
        ]
        .iter()
        .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
        .collect()
    }

    #[test]
    fn prefixes_exclusion_and_exact_names_as_nccl() {
        let pick = |spec: &str| IfaceFilter::parse(spec).unwrap().pick(&ifaces());
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(pick("eth").unwrap(), ip("10.0.0.5"), "IPv4 before IPv6");
        assert_eq!(pick("ib,eth").unwrap(), ip("10.0.0.5"), "interface order");
        assert!(pick("=eth1").unwrap_err().to_string().contains(VAR));
        assert_eq!(pick("=eth10").unwrap(), ip("10.1.0.5"));
        assert_eq!(
            pick("^docker,eth").unwrap(),
            ip("192.168.7.2"),
            "lo only by name"
        );
        assert_eq!(pick("^=eth0,docker0").unwrap(), ip("10.1.0.5"));
        assert_eq!(pick("lo").unwrap(), ip("127.0.0.1"));
        let v6 = vec![("eth0".to_string(), ip("fe80::1"))];
        assert_eq!(
            IfaceFilter::parse("eth").unwrap().pick(&v6).unwrap(),
            ip("fe80::1")
        );
        assert!(IfaceFilter::parse(" ^ ").is_err() && IfaceFilter::parse("").is_err());
    }

    #[test]
    fn a_unique_ids_root_prefers_infiniband_then_any_but_loopback_and_bridges() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(default_address(&ifaces()), ip("192.168.7.2"));
        let no_ib: Vec<_> = ifaces().into_iter().filter(|(n, _)| n != "ib0").collect();
        assert_eq!(default_address(&no_ib), ip("10.0.0.5"), "first, IPv4");
        let only = |list: &[(&str, &str)]| -> Vec<(String, IpAddr)> {
            list.iter().map(|(n, a)| (n.to_string(), ip(a))).collect()
        };
        assert_eq!(
            default_address(&only(&[("eth0", "fe80::1"), ("eth0", "2001:db8::5")])),
            ip("2001:db8::5"),
            "no link-local"
        );
        assert_eq!(
            default_address(&only(&[("lo", "127.0.0.1"), ("docker0", "172.17.0.1")])),
            ip("127.0.0.1"),
            "loopback when nothing else"
        );
    }

    #[test]
    fn this_host_lists_its_loopback() {
        let all = interfaces().unwrap();
        assert!(all.iter().any(|(_, ip)| ip.is_loopback()), "{all:?}");
    }
}
