/*
 * Preloaded (LD_PRELOAD) into every process of a cluster's Ray node by node_run.
 *
 * Ray 2.60 binds its gRPC servers (GCS, raylet, dashboard agent, core workers) and its
 * metrics endpoints to all interfaces, with no option to change it. On a shared SLURM node
 * that exposes them to the whole cluster network. This shim rewrites a wildcard bind()
 * (0.0.0.0 or ::) of a port in the cluster's port ranges to the node's address, and a
 * connect() to loopback on such a port (Ray's components reach the local metrics agent at
 * 127.0.0.1) to the node's address, so everything keeps working. Other ports, other
 * addresses and other processes are untouched.
 *
 * node_run holds 127.0.0.1, [::1] and the node's address on the cluster's named ports
 * (loopback_hold.py) with SO_REUSEPORT, so that no other user can listen where our clients
 * send the token. A bind of such a held port to one of those addresses or to the wildcard
 * (Ray's components on the node's address, the dashboard agent's 127.0.0.1 site) gets
 * SO_REUSEPORT here, which the kernel allows beside the hold only for the same user.
 *
 *   ERAY_BIND_ADDRESS  the node's IPv4 address (the one Ray runs on)
 *   ERAY_BIND_PORTS    port ranges: "lo-hi[,lo-hi...]" (at most 64)
 *   ERAY_HELD_PORTS    the port ranges node_run holds on loopback (same form)
 * Without the first two, nothing is rewritten. All are read once, when the library is loaded.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdint.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*sock_fn)(int, const struct sockaddr *, socklen_t);

/* The environment is read once, when the library is loaded (before main and before any
 * thread): a later setenv() by the program, or a race with one, cannot change what the
 * shim does, and bind() and connect() cost no getenv(). */
#define MAX_RANGES 64
struct ranges {
    unsigned r[MAX_RANGES][2];
    int n;
};
static struct ranges moved, held;
static int have_node;
static struct in_addr node_addr;

static void parse_ranges(const char *spec, struct ranges *out) {
    while (spec && *spec && out->n < MAX_RANGES) {
        char *end;
        unsigned long lo = strtoul(spec, &end, 10), hi = lo;
        if (end == spec) break;
        if (*end == '-') hi = strtoul(end + 1, &end, 10);
        out->r[out->n][0] = (unsigned)lo;
        out->r[out->n][1] = (unsigned)hi;
        out->n++;
        spec = (*end == ',') ? end + 1 : NULL;
    }
}

__attribute__((constructor)) static void read_environment(void) {
    const char *ip = getenv("ERAY_BIND_ADDRESS");
    have_node = ip && inet_pton(AF_INET, ip, &node_addr) == 1;
    parse_ranges(getenv("ERAY_BIND_PORTS"), &moved);
    parse_ranges(getenv("ERAY_HELD_PORTS"), &held);
}

static int in_ranges(const struct ranges *set, unsigned port) {
    for (int i = 0; i < set->n; i++)
        if (set->r[i][0] <= port && port <= set->r[i][1]) return 1;
    return 0;
}

static int port_in_ranges(unsigned port) { return in_ranges(&moved, port); }

static int node_address(struct in_addr *out) {
    if (have_node) *out = node_addr;
    return have_node;
}

static void to_mapped(struct in6_addr *a6, struct in_addr v4) {
    memset(a6, 0, sizeof *a6);
    a6->s6_addr[10] = 0xff;
    a6->s6_addr[11] = 0xff;
    memcpy(&a6->s6_addr[12], &v4, 4);
}

/* An IPv6-only socket cannot take a v4-mapped address: leave it alone. */
static int v6only(int fd) {
    int on = 0;
    socklen_t len = sizeof on;
    return getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, &len) == 0 && on;
}

/* The address to use: `addr` itself, or its rewrite in `buf` (wildcard bind or loopback
 * connect, on a port of the cluster). */
static const struct sockaddr *rewrite(int fd, const struct sockaddr *addr, socklen_t len, int for_bind,
                                      struct sockaddr_storage *buf) {
    struct in_addr node;
    if (!addr || !node_address(&node)) return addr;
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        int hit = for_bind ? in->sin_addr.s_addr == htonl(INADDR_ANY)
                           : in->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
        if (!hit || !port_in_ranges(ntohs(in->sin_port))) return addr;
        struct sockaddr_in *out = (struct sockaddr_in *)buf;
        *out = *in;
        out->sin_addr = node;
        return (const struct sockaddr *)out;
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        struct in6_addr loop4;
        to_mapped(&loop4, (struct in_addr){htonl(INADDR_LOOPBACK)});
        int hit = for_bind ? IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)
                           : (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
                              memcmp(&in6->sin6_addr, &loop4, sizeof loop4) == 0);
        if (!hit || !port_in_ranges(ntohs(in6->sin6_port)) || v6only(fd)) return addr;
        struct sockaddr_in6 *out = (struct sockaddr_in6 *)buf;
        *out = *in6;
        to_mapped(&out->sin6_addr, node);  /* a dual-stack socket reaches IPv4 this way */
        return (const struct sockaddr *)out;
    }
    return addr;
}

/* libc's `name` (found once; the pointer is shared between threads), called with the
 * address rewritten; the raw syscall if libc's cannot be found. */
static int call_next(sock_fn *cache, const char *name, long sysno, int fd, const struct sockaddr *addr,
                     socklen_t len, int for_bind) {
    struct sockaddr_storage buf;
    const struct sockaddr *use = rewrite(fd, addr, len, for_bind, &buf);
    sock_fn fn = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!fn) {
        fn = (sock_fn)dlsym(RTLD_NEXT, name);
        if (!fn) return (int)syscall(sysno, fd, use, len);
        __atomic_store_n(cache, fn, __ATOMIC_RELEASE);
    }
    return fn(fd, use, len);
}

/* Whether `addr` is loopback, the node's address or the wildcard, on a port node_run holds. */
static int joins_hold(const struct sockaddr *addr, socklen_t len) {
    if (!addr || !held.n) return 0;
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        uint32_t a = ntohl(in->sin_addr.s_addr);
        int ours = a == INADDR_ANY || a == INADDR_LOOPBACK ||
                   (have_node && in->sin_addr.s_addr == node_addr.s_addr);
        return ours && in_ranges(&held, ntohs(in->sin_port));
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        struct in6_addr loop4, node6;
        to_mapped(&loop4, (struct in_addr){htonl(INADDR_LOOPBACK)});
        int ours = IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) || IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
                   memcmp(&in6->sin6_addr, &loop4, sizeof loop4) == 0;
        if (have_node) {
            to_mapped(&node6, node_addr);
            ours = ours || memcmp(&in6->sin6_addr, &node6, sizeof node6) == 0;
        }
        return ours && in_ranges(&held, ntohs(in6->sin6_port));
    }
    return 0;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static sock_fn real;
    struct sockaddr_storage buf;
    if (joins_hold(rewrite(fd, addr, len, 1, &buf), len)) {
        int on = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
    }
    return call_next(&real, "bind", SYS_bind, fd, addr, len, 1);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static sock_fn real;
    return call_next(&real, "connect", SYS_connect, fd, addr, len, 0);
}
