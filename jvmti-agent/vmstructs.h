/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HotSpot's own description of its data structures (the tables that the
 * serviceability agent reads: gHotSpotVMStructs, gHotSpotVMTypes), read by
 * name. Offsets start at -1 and every accessor checks them before use: a
 * field missing from this JVM build means "unknown", never a guessed
 * offset. No HotSpot struct is copied here (research/style-models.md §3).
 */
#ifndef FARMEM_VMSTRUCTS_H
#define FARMEM_VMSTRUCTS_H

#include <stddef.h>
#include <stdint.h>

/* Find libjvm's tables. Returns 0, or -ENOENT when this is not a HotSpot JVM we can read. */
int fm_vms_init(char *err, size_t errlen);

/* The reserved Java heap [*start, *start + *bytes), once the heap exists (VMInit or later). */
int fm_vms_heap(uintptr_t *start, uint64_t *bytes, char *err, size_t errlen);

/*
 * Where a command-line flag's value lives (JVMFlag table): a bool flag is
 * one byte there, a size_t/uintx flag eight, a ccstr flag a char pointer.
 * Returns 0, or -ENOENT if the flag is not in this JVM (a GC that was not
 * built in, for example).
 */
int fm_vms_flag_addr(const char *name, const void **addr);
int fm_vms_flag_bool(const char *name); /* 1, 0, or 0 when unknown */

/*
 * Whether the flag's value is the user's: given on the command line, in
 * JAVA_TOOL_OPTIONS or a flags file, or set through management, as against
 * HotSpot's default or its ergonomics. 1 or 0; -ENOENT when this JVM does not
 * say (JVMFlag::_flags and the JVMFlagOrigin constants).
 */
int fm_vms_flag_user_set(const char *name);

/*
 * Write a size_t/uintx flag as the command line would have, for HotSpot code
 * that heeds only a value the user gave (FLAG_IS_CMDLINE): its
 * WAS_SET_ON_COMMAND_LINE bit is set, its origin says ERGONOMIC (which
 * -XX:+PrintFlagsFinal shows). Before the code that reads it runs: in
 * Agent_OnLoad. 0, or -ENOENT when this JVM does not say how.
 */
int fm_vms_flag_set_as_cmdline(const char *name, uint64_t value);

/*
 * Generic lookups by name (slow: a table scan; call them at VMInit, never in a
 * GC callback). fm_vms_field gives a non-static field's offset (address NULL
 * or unused) or a static field's address (offset NULL). -ENOENT if absent.
 */
int fm_vms_field(const char *type, const char *name, int64_t *offset, uintptr_t *address);
int fm_vms_type_size(const char *type, uint64_t *size);
int fm_vms_int_constant(const char *name, int32_t *value); /* gHotSpotVMIntConstants */

#endif
