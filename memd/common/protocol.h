/* SPDX-License-Identifier: Apache-2.0 */
/*
 * farmem memd wire protocol, version 1. The normative description is
 * docs/protocol.md; this header is its C form, shared by memd and by the
 * pager's client side. Everything on the wire is little-endian and packed.
 *
 * A frame is a fixed 24-byte header followed by `len` payload bytes.
 * Requests carry a client-chosen req_id that the reply echoes, so a client
 * may pipeline: memd answers the requests of one connection in order.
 */
#ifndef FARMEM_PROTOCOL_H
#define FARMEM_PROTOCOL_H

#include <stdint.h>

#define FM_PROTO_MAGIC      0x31444d46u /* "FMD1" */
#define FM_PROTO_VERSION    1
#define FM_PAGE_SIZE        4096u
#define FM_PAGE_SHIFT       12
#define FM_NONCE_LEN        32
#define FM_MAC_LEN          32          /* HMAC-SHA256 */
#define FM_SESSION_KEY_LEN  16

/* Bounds that memd enforces on every request (docs/protocol.md, "Limits"). */
#define FM_MAX_BATCH        256u        /* pages per READ, WRITE or COPY */
#define FM_MAX_RANGES       1024u       /* ranges per DISCARD */
#define FM_MAX_EDITS        512u        /* entries per EDIT */
#define FM_MAX_EDIT_PAGES   256u        /* distinct pages one EDIT touches */
#define FM_MAX_SPACE_PAGES  (1ull << 36) /* 256 TiB of 4 KiB pages */
#define FM_MAX_RDMA_REG     64u         /* chunks per RDMA_REG */
#define FM_MAX_PAYLOAD      (FM_MAX_BATCH * (FM_PAGE_SIZE + 16u) + 64u)

enum fm_op {
	FM_OP_HELLO        = 1,  /* C: fm_hello_req; S: fm_hello_rep */
	FM_OP_AUTH         = 2,  /* C: fm_auth_req;  S: fm_auth_rep  */
	FM_OP_SESSION_NEW  = 3,  /* C: -;             S: fm_session  */
	FM_OP_SESSION_JOIN = 4,  /* C: fm_session;    S: -           */
	FM_OP_SPACE_OPEN   = 5,  /* C: fm_space_open_req; S: fm_space_open_rep */
	FM_OP_SPACE_CLOSE  = 6,  /* C: fm_space_ref;  S: -           */
	FM_OP_READ         = 7,  /* C: fm_space_ref + u64 page[count];
	                          * S: fm_page_status[count] + count pages */
	FM_OP_WRITE        = 8,  /* C: fm_space_ref + fm_write_ent[count] + count pages;
	                          * S: u32 status[count] */
	FM_OP_DISCARD      = 9,  /* C: fm_space_ref + fm_range[count]; S: -  */
	FM_OP_STATS        = 10, /* C: -; S: fm_stats */
	FM_OP_SHM_MAP      = 11, /* C: fm_space_ref; S: fm_shm_map_rep + memfd (SCM_RIGHTS) */
	FM_OP_QUOTA        = 12, /* C: fm_quota_req; S: fm_quota_rep */
	FM_OP_RDMA_MAP     = 13, /* C: fm_space_ref; S: fm_rdma_map_rep (memd --rdma only) */
	FM_OP_COPY         = 14, /* C: fm_copy_req + fm_copy_ent[count]; S: u32 status[count]
	                          * (only to a memd that sets FM_HELLO_F_COPY) */
	FM_OP_EDIT         = 15, /* C: fm_space_ref + fm_edit_ent[count] + the PUT entries' bytes;
	                          * S: the GET entries' bytes (only to a memd that sets FM_HELLO_F_EDIT) */
	FM_OP_SHM_ALLOC    = 16, /* C: fm_space_ref + fm_range[count]; S: - (a mapped space, over a
	                          * Unix socket, only to a memd that sets FM_HELLO_F_ALLOC) */
	FM_OP_RDMA_REG     = 17, /* C: fm_space_ref + u64 chunk[count]; S: fm_rdma_reg_ent[count]
	                          * (an RDMA_MAP'd space, only to a memd that sets FM_HELLO_F_RDMA_REG) */
	FM_OP_RDMA_UNREG   = 18, /* C: fm_space_ref + u64 chunk[count]; S: - (only to a memd that
	                          * sets FM_HELLO_F_RDMA_UNREG) */
	FM_OP_ERROR        = 0x7fff, /* S only: status in header, UTF-8 message as payload */
};

/* Header status values (replies) and per-page status values. */
enum fm_status {
	FM_OK          = 0,
	FM_E_PROTO     = 1,  /* malformed frame; memd closes the connection */
	FM_E_VERSION   = 2,  /* no common protocol version */
	FM_E_AUTH      = 3,  /* bad or missing authentication */
	FM_E_OP        = 4,  /* unknown op */
	FM_E_RANGE     = 5,  /* page or space out of range */
	FM_E_TOOBIG    = 6,  /* count or len beyond the limits above */
	FM_E_FULL      = 7,  /* memd or session quota full: the client keeps the page */
	FM_E_NOSPACE   = 8,  /* no such space in this session */
	FM_E_CRC       = 9,  /* page data does not match its checksum */
	FM_E_ABSENT    = 10, /* READ (COPY: its source) of a page never written, or discarded */
	FM_E_STATE     = 11, /* op not allowed now (before auth, no session, ...) */
	FM_E_NOSHM     = 12, /* SHM_MAP over a transport that cannot pass fds */
	FM_E_INTERNAL  = 13,
};

struct fm_hdr {
	uint32_t magic;
	uint16_t op;
	uint16_t status;
	uint64_t req_id;
	uint32_t count;
	uint32_t len;
} __attribute__((packed));

#define FM_HELLO_F_SHM  1u /* server: can pass its store as memfd (Unix socket) */
/*
 * server: knows COPY. An optional op announced by a flag, so that a client
 * never spends a round trip on a memd that predates it (which would answer
 * FM_E_OP); the protocol version stays 1.
 */
#define FM_HELLO_F_COPY 2u
/* server: knows EDIT (the same rule as COPY). */
#define FM_HELLO_F_EDIT 4u
/*
 * server: knows SHM_ALLOC. The kernel charges a shared-memory page to the
 * memory cgroup of the task that first touches it, and with the shm
 * transport that is the client writing a page into memd's store. A client
 * in another memory cgroup than memd's asks memd to allocate the slots it is
 * about to fill, so that memd's cgroup pays for memd's store. memd allocates
 * no more memory in a session's spaces than its grant (and the spaces'
 * meta): a slot allocated holds a page of the grant, written or about to be.
 */
#define FM_HELLO_F_ALLOC 8u
/*
 * client and server: RDMA regions are registered chunk by chunk
 * (RDMA_REG), when the client first writes into a chunk, not whole at
 * RDMA_MAP. Registration pins memory: a space registered whole held its
 * full size in memd whatever was stored, outside memd's capacity. A chunk
 * registered takes its pages (data and meta) from capacity and the
 * session's quota, and is the grant of every page in it: an RDMA client
 * takes no QUOTA. memd refuses RDMA_MAP from a client that does not set
 * this flag (it would use one rkey for the whole region).
 */
#define FM_HELLO_F_RDMA_REG 16u
/*
 * server: knows RDMA_UNREG. A chunk whose pages the client discarded, every
 * one, goes back: memd deregisters it and frees its memory, back to
 * capacity and quota (a JVM's free regions, over RDMA, were otherwise held
 * at their peak until the space closed). The client sends it only for a
 * chunk it has no work request in flight to and none to come until memd
 * answered; its next write there registers the chunk again.
 */
#define FM_HELLO_F_RDMA_UNREG 32u

struct fm_hello_req {
	uint16_t min_version;
	uint16_t max_version;
	uint32_t flags;
	uint8_t  client_nonce[FM_NONCE_LEN];
} __attribute__((packed));

struct fm_hello_rep {
	uint16_t version;
	uint16_t reserved;
	uint32_t flags;        /* FM_HELLO_F_* */
	uint8_t  server_nonce[FM_NONCE_LEN];
} __attribute__((packed));

/*
 * mac = HMAC-SHA256(secret, "farmem-client-v1" || server_nonce || client_nonce)
 * The reply proves the server knows the secret too:
 * mac = HMAC-SHA256(secret, "farmem-server-v1" || client_nonce || server_nonce)
 */
struct fm_auth_req { uint8_t mac[FM_MAC_LEN]; } __attribute__((packed));
struct fm_auth_rep { uint8_t mac[FM_MAC_LEN]; } __attribute__((packed));

struct fm_session {
	uint64_t session_id;
	uint8_t  key[FM_SESSION_KEY_LEN];
} __attribute__((packed));

struct fm_space_open_req {
	uint64_t npages;
	uint32_t flags;
	uint32_t reserved;
} __attribute__((packed));

struct fm_space_open_rep {
	uint32_t space_id;
	uint32_t reserved;
} __attribute__((packed));

struct fm_space_ref {
	uint32_t space_id;
	uint32_t reserved;
} __attribute__((packed));

struct fm_page_status {
	uint32_t status;   /* FM_OK, FM_E_ABSENT or FM_E_RANGE */
	uint32_t crc;      /* crc32c of the page as written */
} __attribute__((packed));

struct fm_write_ent {
	uint64_t page;
	uint32_t crc;      /* crc32c of the page data that follows */
	uint32_t reserved;
} __attribute__((packed));

/*
 * COPY: memd copies pages from one of the session's spaces to another (or the
 * same), stored bytes and their crc, slot to slot: a collector's page moves
 * (uffd/move.c) need no page bytes on the wire.
 */
struct fm_copy_req {
	uint32_t src_space;
	uint32_t dst_space;
} __attribute__((packed));

struct fm_copy_ent {
	uint64_t src_page;
	uint64_t dst_page;
} __attribute__((packed));

/*
 * EDIT: byte-granular changes to one space's pages where memd keeps them,
 * applied in order: a collector's object moves (uffd/compact.c) without their
 * pages crossing the wire. MOVE copies len bytes from src to dst (memmove),
 * PUT stores len bytes that follow the entries (in entry order), GET returns
 * len bytes (the reply, in entry order). src and dst are byte offsets in the
 * space; each side of an entry lies inside one page (len 1..4096). A page
 * written that memd does not hold is zeros first and takes a page of the
 * session's quota; a page read that it does not hold is FM_E_ABSENT. All or
 * nothing: every entry and the checksum of every page it touches are checked
 * first; the pages written get new checksums.
 */
enum fm_edit_kind { FM_EDIT_MOVE = 1, FM_EDIT_PUT = 2, FM_EDIT_GET = 3 };

struct fm_edit_ent {
	uint16_t kind;     /* enum fm_edit_kind */
	uint16_t reserved;
	uint32_t len;
	uint64_t src;      /* MOVE, GET */
	uint64_t dst;      /* MOVE, PUT */
} __attribute__((packed));

struct fm_range {
	uint64_t first;
	uint64_t npages;
} __attribute__((packed));

struct fm_quota_req {
	int64_t delta_pages;   /* > 0 reserve, < 0 release */
} __attribute__((packed));

struct fm_quota_rep {
	uint64_t granted_pages; /* the session's grant after the change */
} __attribute__((packed));

/*
 * One-sided (shared-memory) layout of a space. The memfd holds the page data
 * first, then one fm_shm_meta per page. A client that writes a page stores
 * the data and crc, then publishes FM_SHM_PRESENT with a release store; a
 * reader acquires flags before it trusts crc and data.
 */
struct fm_shm_map_rep {
	uint64_t npages;
	uint64_t data_offset;
	uint64_t meta_offset;
	uint64_t map_len;
} __attribute__((packed));

/* RDMA_MAP: the space's memfd layout (as SHM_MAP) registered for one-sided verbs. */
struct fm_rdma_map_rep {
	uint64_t npages;
	uint64_t data_offset;
	uint64_t meta_offset;
	uint64_t map_len;
	uint64_t addr;             /* remote virtual address of offset 0 */
	uint32_t rkey;             /* 0 when chunked: each chunk has its own (RDMA_REG) */
	uint32_t chunk_pages;      /* pages per chunk (FM_HELLO_F_RDMA_REG); 0: one region, rkey */
} __attribute__((packed));

/*
 * RDMA_REG, per chunk asked for: FM_OK and the rkeys of the chunk's data
 * (pages chunk * chunk_pages onward) and of its meta; FM_E_FULL (no room
 * for its pages in capacity or quota, or the device refused: nothing
 * registered); FM_E_RANGE. A chunk registered already answers its rkeys.
 */
struct fm_rdma_reg_ent {
	uint32_t status;
	uint32_t data_rkey;
	uint32_t meta_rkey;
	uint32_t reserved;
} __attribute__((packed));

/*
 * RDMA: the private data of every rdma_connect. memd puts the QP in the
 * protection domain of that session, where its spaces are registered.
 */
#define FM_RDMA_CONN_MAGIC 0x31435246u /* "FRC1" */
struct fm_rdma_conn_priv {
	uint32_t magic;
	uint32_t reserved;
	struct fm_session session;
} __attribute__((packed));

#define FM_SHM_PRESENT 1u
struct fm_shm_meta {
	uint32_t crc;
	uint32_t flags;
};

struct fm_stats {
	uint64_t capacity_pages;
	uint64_t used_pages;       /* pages held for TCP spaces + shm grants */
	uint64_t sessions;
	uint64_t spaces;
	uint64_t connections;
	uint64_t reads;            /* pages */
	uint64_t writes;           /* pages */
	uint64_t discards;         /* pages */
	uint64_t errors;           /* error replies sent */
	uint64_t full_rejects;     /* pages refused with FM_E_FULL */
} __attribute__((packed));

_Static_assert(sizeof(struct fm_hdr) == 24, "fm_hdr is 24 bytes on the wire");
_Static_assert(sizeof(struct fm_hello_req) == 40, "hello req");
_Static_assert(sizeof(struct fm_write_ent) == 16, "write entry");
_Static_assert(sizeof(struct fm_shm_meta) == 8, "shm meta");
_Static_assert(sizeof(struct fm_copy_req) == 8 && sizeof(struct fm_copy_ent) == 16, "copy");
_Static_assert(sizeof(struct fm_edit_ent) == 24, "edit");
_Static_assert(sizeof(struct fm_rdma_map_rep) == 48 && sizeof(struct fm_rdma_reg_ent) == 16, "rdma");

#endif /* FARMEM_PROTOCOL_H */
