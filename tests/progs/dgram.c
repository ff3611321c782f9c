/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dgram: datagrams received into more buffers than one call pins, while the
 * receiver sleeps in the call and memory pressure evicts around it. A
 * datagram whose copy into the caller's buffer fails (EFAULT: a page paged
 * by SIGBUS left under the call) is dropped by the kernel: it is gone, not
 * waiting to be read again, so a lost buffer is a lost message.
 *
 *   dgram MiB ROUNDS mmsg|msg   (prints "dgram: ok", or what went wrong)
 *
 * mmsg: recvmmsg of 64 messages, each into a page of its own (a DNS or QUIC
 *       server's batch receive); the sender sends 64.
 * msg:  recvmsg of one message of 48 KiB into 48 buffers of 1 KiB, each at
 *       the start of a page of its own.
 *
 * Each round the receiver thread enters its call on buffers that were
 * evicted, the main thread then writes MiB of other paged memory (past the
 * budget), and only then sends. Every message's bytes are checked, and every
 * message of every round must arrive.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096ul
#define MMSGS 64
#define MSG_BUFS 48
#define MSG_PIECE 1024ul

static int sock[2], mmsg_mode;
static uint8_t *rx; /* the receiver's pages: MMSGS or MSG_BUFS of them */
static volatile int round_no;

static uint64_t word(unsigned round, unsigned msg, unsigned k)
{
	return ((uint64_t)round << 40 | (uint64_t)msg << 20 | k) * 0x9e3779b97f4a7c15ull;
}

/* Message msg of a round: len bytes of words. */
static void compose(uint64_t *m, size_t len, unsigned round, unsigned msg)
{
	for (unsigned k = 0; k < len / 8; k++)
		m[k] = word(round, msg, k);
}

static int receive_mmsg(unsigned round)
{
	struct mmsghdr v[MMSGS];
	struct iovec iov[MMSGS];
	int got = 0;

	memset(v, 0, sizeof(v));
	for (unsigned k = 0; k < MMSGS; k++) {
		iov[k].iov_base = rx + k * PAGE;
		iov[k].iov_len = PAGE;
		v[k].msg_hdr.msg_iov = &iov[k];
		v[k].msg_hdr.msg_iovlen = 1;
	}
	while (got < MMSGS) {
		int n = recvmmsg(sock[1], v + got, MMSGS - (unsigned)got, 0, NULL);
		if (n < 0)
			return fprintf(stderr, "dgram: round %u: recvmmsg after %d: %s\n", round, got, strerror(errno)), 1;
		got += n;
	}
	for (unsigned k = 0; k < MMSGS; k++) {
		const uint64_t *m = (const uint64_t *)(rx + k * PAGE);
		if (v[k].msg_len != PAGE || m[0] != word(round, k, 0) || m[PAGE / 8 - 1] != word(round, k, PAGE / 8 - 1))
			return fprintf(stderr, "dgram: round %u: message %u of %u bytes reads %#lx (message %u expected: "
				       "one was lost)\n", round, k, v[k].msg_len, (unsigned long)m[0], k), 1;
	}
	return 0;
}

static int receive_msg(unsigned round)
{
	struct iovec iov[MSG_BUFS];
	struct msghdr h = { .msg_iov = iov, .msg_iovlen = MSG_BUFS };
	ssize_t n;

	for (unsigned k = 0; k < MSG_BUFS; k++) {
		iov[k].iov_base = rx + k * PAGE;
		iov[k].iov_len = MSG_PIECE;
	}
	n = recvmsg(sock[1], &h, 0);
	if (n != (ssize_t)(MSG_BUFS * MSG_PIECE))
		return fprintf(stderr, "dgram: round %u: recvmsg returned %zd (%s)\n", round, n,
			       n < 0 ? strerror(errno) : "short"), 1;
	for (unsigned k = 0; k < MSG_BUFS; k++) {
		const uint64_t *m = (const uint64_t *)(rx + k * PAGE);
		for (unsigned w = 0; w < MSG_PIECE / 8; w++)
			if (m[w] != word(round, 0, k * (unsigned)(MSG_PIECE / 8) + w))
				return fprintf(stderr, "dgram: round %u: buffer %u word %u reads %#lx\n", round, k, w,
					       (unsigned long)m[w]), 1;
	}
	return 0;
}

static void *receiver(void *arg)
{
	return (void *)(uintptr_t)(mmsg_mode ? receive_mmsg((unsigned)(uintptr_t)arg) :
					       receive_msg((unsigned)(uintptr_t)arg));
}

static int send_round(unsigned round)
{
	static uint64_t m[MSG_BUFS * MSG_PIECE / 8];

	if (!mmsg_mode) {
		compose(m, sizeof(m), round, 0);
		return send(sock[0], m, sizeof(m), 0) == (ssize_t)sizeof(m) ? 0 : (perror("dgram: send"), 1);
	}
	for (unsigned k = 0; k < MMSGS; k++) {
		compose(m, PAGE, round, k);
		if (send(sock[0], m, PAGE, 0) != (ssize_t)PAGE)
			return perror("dgram: send"), 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 0, len = mib << 20;
	unsigned rounds = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 0;
	int buf_size = 4 << 20;
	struct timeval wait_for_lost = { .tv_sec = 5 };
	uint8_t *other;

	if (argc != 4 || !mib || !rounds || (strcmp(argv[3], "mmsg") && strcmp(argv[3], "msg")))
		return fprintf(stderr, "usage: dgram MiB ROUNDS mmsg|msg\n"), 2;
	mmsg_mode = !strcmp(argv[3], "mmsg");
	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sock))
		return perror("dgram: socketpair"), 1;
	/* Room for a whole round of messages queued at once; a lost message ends the wait for it (EAGAIN). */
	setsockopt(sock[0], SOL_SOCKET, SO_SNDBUF, &buf_size, sizeof(buf_size));
	setsockopt(sock[1], SOL_SOCKET, SO_RCVBUF, &buf_size, sizeof(buf_size));
	setsockopt(sock[1], SOL_SOCKET, SO_RCVTIMEO, &wait_for_lost, sizeof(wait_for_lost));
	rx = mmap(NULL, MMSGS * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	other = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rx == MAP_FAILED || other == MAP_FAILED)
		return perror("dgram: mmap"), 1;
	/* Paged by farmem: both past its threshold. Touched once, so that they have bytes to lose. */
	memset(rx, 0x5a, MMSGS * PAGE);
	for (unsigned r = 0; r < rounds; r++) {
		pthread_t t;
		void *bad;

		for (size_t o = 0; o < len; o += PAGE) /* the receiver's pages leave */
			other[o] = (uint8_t)(r + o);
		if (pthread_create(&t, NULL, receiver, (void *)(uintptr_t)r))
			return fprintf(stderr, "dgram: no thread\n"), 1;
		usleep(20000); /* asleep in its call, its buffers made resident */
		for (size_t o = 0; o < len; o += PAGE) /* and now, while it sleeps, pressure again */
			other[o] = (uint8_t)(r + o + 1);
		if (send_round(r))
			return 1;
		pthread_join(t, &bad);
		if (bad)
			return 1;
	}
	printf("dgram: ok (%u rounds of %s)\n", rounds, mmsg_mode ? "64 messages by recvmmsg" : "a message in 48 buffers");
	return 0;
}
