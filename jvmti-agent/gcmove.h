/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stock JVM's compaction, done where the pages lie. HotSpot's full GCs (G1,
 * Serial, Parallel) slide each live object down with Copy::conjoint_words,
 * which calls libjvm's memmove for anything over 8 words: with most of the
 * heap in memd, each such copy fetches its source pages and faults in
 * destination pages whose bytes are dead, and the destination is written back
 * later. libjvm's memmove is interposed on (got.h); in a pause, a move that
 * touches a page memd holds is handed to fm_pager_move_bytes (uffd/compact.c:
 * remote pages moved inside memd's store, never fetched), which the farmem
 * JDK's collector calls itself. Everything else goes to memmove. Likewise
 * libjvm's memcpy, with which stock G1's pauses copy surviving objects: a
 * primitive array promoted into pages of an old region that are not resident
 * has its whole pages written in memd's store (gcmove.c says which), unless
 * the program was seen reading its promoted arrays back before the next pause;
 * one whose source pages memd holds and whose destination is resident has
 * those bytes copied from memd's store, its source never fetched.
 */
#ifndef FARMEM_AGENT_GCMOVE_H
#define FARMEM_AGENT_GCMOVE_H

#include "pager_ref.h"

/*
 * on: interpose on libjvm.so's memmove and memcpy (once) and hand moves to the pager
 * from the next pause on; 1, or -ENOENT (libjvm imports no memmove) or the
 * -errno of mprotect. Off: 0, moves go to memmove.
 */
int fm_gcmove_setup(const struct fm_pager_ref *ref, int on);
/* A pause begins (1) or ends (0): moves are handed to the pager only inside one. */
void fm_gcmove_pause(int in_pause);
/*
 * The pager's full_gc_in_memd (pager.h): 1 in a full GC whose moves memd
 * does. Its phases read each live object's header, a page apart or more:
 * a GC thread's read-ahead fetched the object bodies between them, which
 * the compaction then moved through local memory.
 */
int fm_gcmove_full_gc(void);

#endif
