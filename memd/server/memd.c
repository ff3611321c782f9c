// SPDX-License-Identifier: Apache-2.0
/*
 * farmem-memd: the memory server. This file holds the command line, the
 * listening sockets and the event loop; the protocol is server_conn.c and
 * the page store server_store.c.
 *
 * Threads: N workers, each with its own epoll set. Every listening socket is
 * in every set with EPOLLEXCLUSIVE, so one worker wakes per new connection.
 * The kernel tends to wake the same one, so the acceptor hands connections
 * out round-robin by adding them to the chosen worker's epoll set; from then
 * on only that worker touches the connection. Sockets are non-blocking and a
 * connection never waits for another, so a slow or hostile client costs
 * only itself.
 * The main thread waits for SIGTERM/SIGINT and then stops the workers.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "fm_util.h"
#include "server.h"

#define MAX_SECRET   (64u << 10)
#define MAX_THREADS  64
#define MAX_EVENTS   64
#define ACCEPT_BURST 16

enum obj_kind { OBJ_WAKE = 1, OBJ_LISTENER, OBJ_CONN };

struct listener {
	int kind;
	int fd;
	bool is_unix;
	char name[160];
};

struct econn {
	int kind;
	struct memd_conn c;
};

struct worker {
	pthread_t th;
	unsigned id;
	int ep;
	int spare_fd;            /* given up to accept (and drop) when out of fds */
	pthread_mutex_t lock;    /* conns: other workers add to it */
	struct memd_conn *conns; /* for the handshake timeout sweep and shutdown */
	uint64_t last_emfile_log;
};

static struct {
	struct memd_store st;
	uint8_t *secret;
	size_t secret_len;
	struct listener *ls;
	unsigned nls;
	struct worker *ws;
	unsigned nws;            /* set up */
	unsigned nrunning;       /* threads started */
	unsigned rr;             /* round-robin cursor for new connections */
	struct { int kind; int fd; } wake;
	int stop;
	const char *unix_path;
	dev_t unix_dev;
	ino_t unix_ino;
	uint64_t spin_ns;        /* --spin-us */
} srv;

static const char usage_text[] =
"usage: farmem-memd [--listen HOST:PORT]... [--unix PATH] [--capacity SIZE]\n"
"                   [--session-quota SIZE] [--secret-file FILE] [--threads N]\n"
"                   [--ready-fd FD] [--log LEVEL] [--numa-node N] [--idmap]\n"
"                   [--spin-us US]\n"
"\n"
"Serve pages to farmem clients over TCP and/or a Unix socket.\n"
"\n"
"  --listen HOST:PORT   TCP address to listen on (repeatable; [v6addr]:PORT, empty HOST = all)\n"
"  --unix PATH          Unix socket to listen on (clients there may map spaces: SHM_MAP)\n"
"  --rdma ADDR:PORT     RDMA (librdmacm) listener; also TCP on ADDR:PORT for its control\n"
"  --capacity SIZE      memory for pages, e.g. 64G (default: half of physical memory)\n"
"  --numa-node N        keep the page store on NUMA node N (a CPU-less CXL node is a slow tier)\n"
"  --idmap              keep spaces in identity-mapped memory (VA == PA) from /dev/swapva\n"
"                       (kmod-swapva, CAP_SYS_ADMIN); allocated whole, so --capacity bounds\n"
"                       the spaces' size; stream transports only (no SHM_MAP/RDMA_MAP)\n"
"  --session-quota SIZE most one session may hold (default: the capacity)\n"
"  --secret-file FILE   shared secret (file bytes, trailing newline stripped);\n"
"                       default: the FARMEM_SECRET environment variable\n"
"  --threads N          event loop threads, 1..64 (default 2)\n"
"  --spin-us US         after serving, poll for the next request this long before\n"
"                       sleeping (default 0: sleep at once); for a memory server\n"
"                       whose CPUs its clients' programs do not need\n"
"  --ready-fd FD        write \"ready\\n\" to FD and close it once listening (and do not\n"
"                       say where it listens below --log info)\n"
"  --log LEVEL          error, warn, info or debug (default warn)\n"
"\n"
"A secret is required. At least one --listen or --unix is required.\n";

static void __attribute__((noreturn)) usage_exit(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
static void usage_exit(const char *fmt, ...)
{
	if (fmt) {
		va_list ap;

		fputs("farmem-memd: ", stderr);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
	}
	fputs(usage_text, stderr);
	exit(2);
}

/* ---- secret ----------------------------------------------------------- */

static int load_secret(const char *file)
{
	uint8_t *buf;
	size_t len = 0;
	int fd, ret = 0;

	if (!file) {
		const char *env = getenv("FARMEM_SECRET");

		if (!env || !*env)
			return -ENOENT;
		srv.secret_len = strlen(env);
		srv.secret = (uint8_t *)strdup(env);
		return srv.secret ? 0 : -ENOMEM;
	}
	fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	buf = malloc(MAX_SECRET + 1);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, buf + len, MAX_SECRET + 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = -errno;
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > MAX_SECRET) {
			ret = -EFBIG;
			goto out;
		}
	}
	/* Files written by editors and `echo` end in a newline that is not part of it. */
	while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
		len--;
	if (!len) {
		ret = -ENODATA;
		goto out;
	}
	srv.secret = buf;
	srv.secret_len = len;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return ret;
}

/* ---- listeners -------------------------------------------------------- */

static struct listener *add_listener(int fd, bool is_unix, const char *name)
{
	struct listener *n = realloc(srv.ls, (srv.nls + 1) * sizeof(*n));

	if (!n)
		return NULL;
	srv.ls = n;
	n = &srv.ls[srv.nls++];
	memset(n, 0, sizeof(*n));
	n->kind = OBJ_LISTENER;
	n->fd = fd;
	n->is_unix = is_unix;
	snprintf(n->name, sizeof(n->name), "%s", name);
	return n;
}

/* Split "HOST:PORT", "tcp:HOST:PORT" or "[V6]:PORT"; returns 0 or -EINVAL. */
static int split_hostport(const char *spec, char *host, size_t hlen, char *port, size_t plen)
{
	const char *colon, *h = spec;
	size_t n;

	if (strncmp(h, "tcp:", 4) == 0)
		h += 4;
	colon = strrchr(h, ':');
	if (!colon || !colon[1] || strlen(colon + 1) >= plen)
		return -EINVAL;
	for (const char *q = colon + 1; *q; q++)
		if (*q < '0' || *q > '9')
			return -EINVAL;
	if (atol(colon + 1) > 65535)
		return -EINVAL;
	n = (size_t)(colon - h);
	if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
		h++;
		n -= 2;
	}
	if (n >= hlen)
		return -EINVAL;
	memcpy(host, h, n);
	host[n] = '\0';
	strcpy(port, colon + 1);
	return 0;
}

/*
 * Someone who runs memd in the foreground wants to see where it listens; a
 * program that started it with --ready-fd learns that from the fd, and its
 * own output stays its own.
 */
static bool announce_listening = true;

static void say_listening(const char *name)
{
	if (announce_listening)
		fm_notice("listening on %s", name);
	else
		fm_info("listening on %s", name);
}

static int listen_tcp(const char *spec)
{
	char host[256], port[8], name[160], abuf[INET6_ADDRSTRLEN];
	struct addrinfo hints = { 0 }, *res = NULL, *ai;
	int ret, fd = -1, one = 1, count = 0;

	if (split_hostport(spec, host, sizeof(host), port, sizeof(port)))
		return -EINVAL;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	ret = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
	if (ret) {
		fm_err("cannot resolve %s: %s", spec, gai_strerror(ret));
		return -EHOSTUNREACH;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int p = 0;

		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
			goto fail;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		/* One socket per family: "::" must not also take the IPv4 port. */
		if (ai->ai_family == AF_INET6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0)
			goto fail;
		getsockname(fd, (struct sockaddr *)&ss, &sl);
		if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;

			inet_ntop(AF_INET6, &s6->sin6_addr, abuf, sizeof(abuf));
			p = ntohs(s6->sin6_port);
			snprintf(name, sizeof(name), "tcp:[%s]:%d", abuf, p);
		} else {
			struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;

			inet_ntop(AF_INET, &s4->sin_addr, abuf, sizeof(abuf));
			p = ntohs(s4->sin_port);
			snprintf(name, sizeof(name), "tcp:%s:%d", abuf, p);
		}
		if (!add_listener(fd, false, name)) {
			errno = ENOMEM;
			goto fail;
		}
		say_listening(name);
		fd = -1;
		count++;
	}
	freeaddrinfo(res);
	return count ? 0 : -EADDRNOTAVAIL;
fail:
	ret = -errno;
	fm_err("cannot listen on %s: %s", spec, strerror(errno));
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	return ret;
}

static int listen_unix(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat sb;
	char name[160];
	int fd, ret;

	strcpy(sa.sun_path, path); /* length checked with the flags */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (lstat(path, &sb) == 0) {
		int probe;

		/* Replace a stale socket, never a live server or another file. */
		if (!S_ISSOCK(sb.st_mode)) {
			fm_err("%s exists and is not a socket", path);
			ret = -EEXIST;
			goto fail;
		}
		probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(probe);
			fm_err("another server is listening on %s", path);
			ret = -EADDRINUSE;
			goto fail;
		}
		if (probe >= 0)
			close(probe);
		unlink(path);
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 1024) < 0) {
		ret = -errno;
		fm_err("cannot listen on unix:%s: %s", path, strerror(errno));
		goto fail;
	}
	if (stat(path, &sb) == 0) {
		srv.unix_dev = sb.st_dev;
		srv.unix_ino = sb.st_ino;
	}
	srv.unix_path = path;
	snprintf(name, sizeof(name), "unix:%s", path);
	if (!add_listener(fd, true, name)) {
		ret = -ENOMEM;
		goto fail;
	}
	say_listening(name);
	return 0;
fail:
	close(fd);
	return ret;
}

/* Remove our socket file, unless someone replaced it since. */
static void unlink_unix(void)
{
	struct stat sb;

	if (!srv.unix_path)
		return;
	if (stat(srv.unix_path, &sb) == 0 && sb.st_dev == srv.unix_dev &&
	    sb.st_ino == srv.unix_ino)
		unlink(srv.unix_path);
}

/* ---- event loop ------------------------------------------------------- */

static void conn_unlink(struct worker *w, struct memd_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		w->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

/* Free a connection already unlinked from its worker. */
static void conn_free(struct worker *w, struct econn *ec)
{
	struct memd_conn *c = &ec->c;

	if (c->fd >= 0)
		epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
	fm_debug("worker %u: closing fd %d", w->id, c->fd);
	memd_conn_fini(c);
	free(ec);
}

static void conn_close(struct worker *w, struct econn *ec)
{
	pthread_mutex_lock(&w->lock);
	conn_unlink(w, &ec->c);
	pthread_mutex_unlock(&w->lock);
	conn_free(w, ec);
}

static void conn_event(struct worker *w, struct econn *ec, uint32_t events)
{
	struct memd_conn *c = &ec->c;
	bool readable = events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP);
	uint32_t want;
	int ret;

	ret = memd_conn_service(c, readable);
	if (ret || memd_conn_done(c)) {
		if (ret && ret != -ECONNRESET && ret != -EPIPE)
			fm_debug("fd %d: %s", c->fd, strerror(-ret));
		conn_close(w, ec);
		return;
	}
	want = (memd_conn_wants_read(c) ? EPOLLIN : 0) | (memd_conn_wants_write(c) ? EPOLLOUT : 0);
	if (want != c->events) {
		struct epoll_event ev = { .events = want, .data.ptr = ec };

		if (epoll_ctl(w->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) {
			conn_close(w, ec);
			return;
		}
		c->events = want;
	}
}

/* Out of fds: accept and drop one connection, so that the listener stops firing. */
static void shed_connection(struct worker *w, struct listener *l)
{
	uint64_t now = fm_now_ns();
	int fd;

	if (now - w->last_emfile_log > 10ull * 1000000000ull) {
		fm_warn("out of file descriptors: refusing connections on %s", l->name);
		w->last_emfile_log = now;
	}
	if (w->spare_fd >= 0) {
		close(w->spare_fd);
		w->spare_fd = -1;
	}
	fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd >= 0)
		close(fd);
	w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static struct econn *econn_of(struct memd_conn *c)
{
	return (struct econn *)((char *)c - offsetof(struct econn, c));
}

/* Give a new connection to the next worker in turn. */
static void hand_off(struct listener *l, int fd)
{
	unsigned i = __atomic_fetch_add(&srv.rr, 1, __ATOMIC_RELAXED) % srv.nws;
	struct worker *t = &srv.ws[i];
	struct epoll_event ev;
	struct econn *ec;
	int one = 1;

	/* Replies are whole frames already; do not hold them for Nagle. */
	if (!l->is_unix)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	ec = malloc(sizeof(*ec));
	if (!ec) {
		close(fd);
		return;
	}
	ec->kind = OBJ_CONN;
	memd_conn_init(&ec->c, &srv.st, srv.secret, srv.secret_len, fd, l->is_unix);
	ec->c.owner = t;
	ec->c.events = EPOLLIN;
	/* Linked before it can fire: its worker may run it as soon as it is added. */
	pthread_mutex_lock(&t->lock);
	ec->c.next = t->conns;
	if (t->conns)
		t->conns->prev = &ec->c;
	t->conns = &ec->c;
	pthread_mutex_unlock(&t->lock);
	ev.events = EPOLLIN;
	ev.data.ptr = ec;
	if (epoll_ctl(t->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
		fm_warn("adding a connection: %s", strerror(errno));
		conn_close(t, ec);
		return;
	}
	fm_debug("worker %u: connection fd %d on %s", t->id, fd, l->name);
}

static void accept_some(struct worker *w, struct listener *l)
{
	for (int i = 0; i < ACCEPT_BURST; i++) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE)
				shed_connection(w, l);
			else if (errno != EAGAIN && errno != EWOULDBLOCK)
				fm_warn("accept on %s: %s", l->name, strerror(errno));
			return;
		}
		hand_off(l, fd);
	}
}

/* Connections that have not authenticated in time hold an fd for nothing. */
static void sweep(struct worker *w, uint64_t now)
{
	struct memd_conn *c, *next, *expired = NULL;

	pthread_mutex_lock(&w->lock);
	for (c = w->conns; c; c = next) {
		next = c->next;
		if (c->state != MEMD_C_READY && now - c->born_ns > MEMD_AUTH_TIMEOUT_NS) {
			conn_unlink(w, c);
			c->next = expired;
			expired = c;
		}
	}
	pthread_mutex_unlock(&w->lock);
	for (c = expired; c; c = next) {
		next = c->next;
		fm_info("fd %d: no authentication within %llu s, closing", c->fd,
			MEMD_AUTH_TIMEOUT_NS / 1000000000ull);
		conn_free(w, econn_of(c));
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct epoll_event evs[MAX_EVENTS];
	uint64_t last_sweep = fm_now_ns(), spin_until = 0;

	while (!__atomic_load_n(&srv.stop, __ATOMIC_ACQUIRE)) {
		/*
		 * --spin-us: after serving, poll for the next request before
		 * sleeping. A client in the middle of its faults sends it within
		 * microseconds, and where idle CPUs halt, a sleeping worker costs
		 * the client an IPI to wake it. Every time, not only while requests
		 * have come that fast: a program's faults come in bursts, and a rule
		 * that stopped polling after a long gap lost the next burst. Between
		 * polls sched_yield: a runnable thread on this CPU (the program's,
		 * when memd runs beside it) goes first. Off by default: beside a
		 * program with threads for both CPUs it still costs it time
		 * (bench/RESULTS.md, session 20).
		 */
		int spinning = spin_until && fm_now_ns() < spin_until;
		int n = epoll_wait(w->ep, evs, MAX_EVENTS, spinning ? 0 : 1000);
		uint64_t now;

		if (n < 0 && errno != EINTR) {
			fm_err("worker %u: epoll_wait: %s", w->id, strerror(errno));
			break;
		}
		if (n == 0 && spinning) {
			sched_yield();
			continue;
		}
		for (int i = 0; i < n; i++) {
			int kind = *(int *)evs[i].data.ptr;

			if (kind == OBJ_LISTENER)
				accept_some(w, evs[i].data.ptr);
			else if (kind == OBJ_CONN)
				conn_event(w, evs[i].data.ptr, evs[i].events);
		}
		now = fm_now_ns();
		spin_until = n > 0 && srv.spin_ns ? now + srv.spin_ns : 0;
		if (now - last_sweep >= 1000000000ull) {
			sweep(w, now);
			last_sweep = now;
		}
	}
	return NULL;
}

static int start_workers(unsigned n)
{
	srv.ws = calloc(n, sizeof(*srv.ws));
	if (!srv.ws)
		return -ENOMEM;
	/* Every epoll set exists before any worker runs: hand_off may pick any. */
	for (unsigned i = 0; i < n; i++) {
		struct worker *w = &srv.ws[i];
		struct epoll_event ev;

		w->id = i;
		pthread_mutex_init(&w->lock, NULL);
		w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		w->ep = epoll_create1(EPOLL_CLOEXEC);
		if (w->ep < 0)
			return -errno;
		srv.nws++;
		ev.events = EPOLLIN;
		ev.data.ptr = &srv.wake;
		if (epoll_ctl(w->ep, EPOLL_CTL_ADD, srv.wake.fd, &ev) < 0)
			return -errno;
		for (unsigned j = 0; j < srv.nls; j++) {
			/* Wake one worker per incoming connection, not all of them. */
			ev.events = EPOLLIN | EPOLLEXCLUSIVE;
			ev.data.ptr = &srv.ls[j];
			if (epoll_ctl(w->ep, EPOLL_CTL_ADD, srv.ls[j].fd, &ev) < 0)
				return -errno;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		int ret = -pthread_create(&srv.ws[i].th, NULL, worker_main, &srv.ws[i]);

		if (ret)
			return ret;
		srv.nrunning++;
	}
	return 0;
}

static void stop_workers(void)
{
	uint64_t one = 1;

	__atomic_store_n(&srv.stop, 1, __ATOMIC_RELEASE);
	/* Never read: the eventfd stays readable and wakes every worker. */
	if (write(srv.wake.fd, &one, sizeof(one)) < 0)
		fm_warn("waking the workers: %s", strerror(errno));
	for (unsigned i = 0; i < srv.nrunning; i++)
		pthread_join(srv.ws[i].th, NULL);
	/* Now nobody accepts or hands off: free what the workers held. */
	for (unsigned i = 0; i < srv.nws; i++) {
		while (srv.ws[i].conns)
			conn_close(&srv.ws[i], econn_of(srv.ws[i].conns));
		if (srv.ws[i].ep >= 0)
			close(srv.ws[i].ep);
		if (srv.ws[i].spare_fd >= 0)
			close(srv.ws[i].spare_fd);
	}
}

static uint64_t default_capacity(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	if (pages <= 0 || psz <= 0)
		return 1ull << 30;
	return (uint64_t)pages * (uint64_t)psz / 2;
}

static void raise_fd_limit(void)
{
	struct rlimit rl;

	/* Each connection and each space is an fd. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "unix", required_argument, NULL, 'u' },
		{ "rdma", required_argument, NULL, 'R' },
		{ "capacity", required_argument, NULL, 'c' },
		{ "session-quota", required_argument, NULL, 'q' },
		{ "secret-file", required_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 't' },
		{ "ready-fd", required_argument, NULL, 'r' },
		{ "log", required_argument, NULL, 'L' },
		{ "numa-node", required_argument, NULL, 'n' },
		{ "idmap", no_argument, NULL, 'I' },
		{ "spin-us", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	/* Static: reachable from anywhere, so that early exits leak nothing. */
	static const char **tcp;
	const char *unix_path = NULL, *secret_file = NULL, *rdma_spec = NULL;
	uint64_t capacity = default_capacity(), quota = 0, threads = 2, v;
	bool have_quota = false, idmap = false;
	int ntcp = 0, ready_fd = -1, opt, ret, sig, status = 0, numa_node = -1;
	sigset_t sigs;

	fm_log_prefix = "farmem-memd";
	tcp = calloc((size_t)argc, sizeof(*tcp));
	if (!tcp)
		return 1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'l':
			tcp[ntcp++] = optarg;
			break;
		case 'R':  /* RDMA on ADDR:PORT; its control connection is TCP on the same port */
			rdma_spec = optarg;
			tcp[ntcp++] = optarg;
			break;
		case 'u':
			if (!*optarg || strlen(optarg) >= sizeof(((struct sockaddr_un *)0)->sun_path))
				usage_exit("--unix: path must be 1..%zu bytes",
					   sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
			unix_path = optarg;
			break;
		case 'c':
			if (fm_parse_bytes(optarg, &capacity))
				usage_exit("--capacity: bad size '%s'", optarg);
			break;
		case 'q':
			if (fm_parse_bytes(optarg, &quota))
				usage_exit("--session-quota: bad size '%s'", optarg);
			have_quota = true;
			break;
		case 's':
			secret_file = optarg;
			break;
		case 't':
			if (fm_parse_u64(optarg, 1, MAX_THREADS, &threads))
				usage_exit("--threads: want a number in 1..%d, not '%s'", MAX_THREADS,
					   optarg);
			break;
		case 'r':
			if (fm_parse_u64(optarg, 0, 1 << 20, &v) || fcntl((int)v, F_GETFD) < 0)
				usage_exit("--ready-fd: '%s' is not an open file descriptor", optarg);
			ready_fd = (int)v;
			announce_listening = false;
			break;
		case 'L':
			ret = fm_log_level_parse(optarg);
			if (ret < 0)
				usage_exit("--log: want error, warn, info or debug, not '%s'", optarg);
			fm_log_level = ret;
			break;
		case 'n': {
			char node_dir[64];
			if (fm_parse_u64(optarg, 0, 1023, &v))
				usage_exit("--numa-node: want a node number, not '%s'", optarg);
			snprintf(node_dir, sizeof(node_dir), "/sys/devices/system/node/node%llu",
				 (unsigned long long)v);
			if (access(node_dir, F_OK))
				usage_exit("--numa-node: this machine has no NUMA node %llu (see numactl -H)",
					   (unsigned long long)v);
			numa_node = (int)v;
			break;
		}
		case 'I':
			idmap = true;
			break;
		case 'S':
			if (fm_parse_u64(optarg, 0, 10000, &v))
				usage_exit("--spin-us: want microseconds in 0..10000, not '%s'", optarg);
			srv.spin_ns = v * 1000;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		default:
			if (optopt)
				usage_exit("option '%s' needs a value or is unknown", argv[optind - 1]);
			usage_exit("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		usage_exit("unexpected argument '%s'", argv[optind]);
	for (int i = 0; i < ntcp; i++) {
		char h[256], p[8];

		if (split_hostport(tcp[i], h, sizeof(h), p, sizeof(p)))
			usage_exit("--listen: want HOST:PORT, not '%s'", tcp[i]);
	}
	if (!ntcp && !unix_path)
		usage_exit("nothing to listen on: give --listen HOST:PORT and/or --unix PATH");

	ret = load_secret(secret_file);
	if (ret == -ENOENT && !secret_file) {
		fm_err("a secret is required: give --secret-file FILE or set FARMEM_SECRET");
		return 2;
	}
	if (ret) {
		fm_err("cannot use secret file %s: %s", secret_file,
		       ret == -ENODATA ? "it is empty" :
		       ret == -EFBIG ? "it is larger than 64 KiB" : strerror(-ret));
		return 2;
	}
	{
		char why[256];
		if (fm_auth_init(why, sizeof(why))) {
			fm_err("%s", why);
			return 2;
		}
	}

	/* Signals go to the main thread's sigwait; peers that vanish must not kill us. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit();

	capacity /= FM_PAGE_SIZE;
	quota = have_quota ? quota / FM_PAGE_SIZE : capacity;
	ret = memd_store_init(&srv.st, capacity, quota);
	srv.st.numa_node = numa_node;
	if (ret) {
		fm_err("cannot set up the store: %s", strerror(-ret));
		return 1;
	}
	if (idmap && numa_node >= 0) {
		fm_err("--idmap and --numa-node cannot be combined: the module chooses where "
		       "identity-mapped pages lie");
		return 2;
	}
	if (idmap) {
		char msg[256];

		ret = memd_store_idmap(&srv.st, msg, sizeof(msg));
		if (ret) {
			fm_err("%s", msg);
			return 1;
		}
	}
	srv.wake.kind = OBJ_WAKE;
	srv.wake.fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv.wake.fd < 0) {
		fm_err("eventfd: %s", strerror(errno));
		return 1;
	}
	for (int i = 0; i < ntcp; i++) {
		ret = listen_tcp(tcp[i]);
		if (ret) {
			status = 1;
			goto out;
		}
	}
	if (unix_path) {
		ret = listen_unix(unix_path);
		if (ret) {
			status = 1;
			goto out;
		}
	}
	if (rdma_spec) {
		ret = memd_rdma_start(rdma_spec, &srv.st);
		if (ret) {
			status = 1;
			goto out;
		}
	}
	ret = start_workers((unsigned)threads);
	if (ret) {
		fm_err("cannot start the workers: %s", strerror(-ret));
		status = 1;
		goto out;
	}
	fm_info("serving: capacity %llu pages, session quota %llu pages, %u threads",
		(unsigned long long)capacity, (unsigned long long)quota, (unsigned)threads);
	if (ready_fd >= 0) {
		if (fm_write_full(ready_fd, "ready\n", 6))
			fm_warn("--ready-fd %d: %s", ready_fd, strerror(errno));
		close(ready_fd);
	}

	for (;;) {
		sig = sigwaitinfo(&sigs, NULL);
		if (sig == SIGTERM || sig == SIGINT)
			break;
	}
	fm_info("signal %d: shutting down", sig);
out:
	memd_rdma_stop();
	stop_workers();
	for (unsigned i = 0; i < srv.nls; i++)
		close(srv.ls[i].fd);
	unlink_unix();
	memd_store_fini(&srv.st);
	close(srv.wake.fd);
	free(srv.ls);
	free(srv.ws);
	free(srv.secret);
	free(tcp);
	return status;
}
