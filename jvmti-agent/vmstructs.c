// SPDX-License-Identifier: Apache-2.0
/*
 * HotSpot's VMStructs tables, read by name (see vmstructs.h).
 *
 * libjvm exports the tables and the layout of their entries as plain data
 * symbols (vmStructs.cpp: gHotSpotVMStructEntryArrayStride and friends), so
 * the entry layout is read too, not assumed. The heap's bounds are
 *   Universe::_collectedHeap -> CollectedHeap::_reserved (a MemRegion)
 *   -> MemRegion::_start, MemRegion::_word_size
 * and flags are JVMFlag::flags[0 .. JVMFlag::numFlags) with _name/_addr.
 */
#include "vmstructs.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

struct field {
	const char *type, *name;
	int64_t offset;      /* -1 until found */
	uintptr_t address;   /* static fields */
};

static struct field f_collected_heap = { "Universe", "_collectedHeap", -1, 0 };
static struct field f_reserved = { "CollectedHeap", "_reserved", -1, 0 };
static struct field f_mr_start = { "MemRegion", "_start", -1, 0 };
static struct field f_mr_words = { "MemRegion", "_word_size", -1, 0 };
static struct field f_flag_name = { "JVMFlag", "_name", -1, 0 };
static struct field f_flag_addr = { "JVMFlag", "_addr", -1, 0 };
static struct field f_flag_bits = { "JVMFlag", "_flags", -1, 0 };
static struct field f_flags = { "JVMFlag", "flags", -1, 0 };
static struct field f_num_flags = { "JVMFlag", "numFlags", -1, 0 };
static int64_t flag_size = -1;
static int ready;

/* The tables and their entry layout, kept for the lookups by name below. */
static const char *t_structs, *t_types, *t_ints;
static uint64_t s_stride, s_type, s_field, s_static, s_off, s_addr;
static uint64_t ty_stride, ty_name, ty_size, i_stride, i_name, i_value;

static int find_libjvm(struct dl_phdr_info *info, size_t size, void *data)
{
	const char *n = info->dlpi_name, *slash = n ? strrchr(n, '/') : NULL;
	(void)size;
	if (slash && !strcmp(slash + 1, "libjvm.so")) {
		snprintf((char *)data, 512, "%s", n);
		return 1;
	}
	return 0;
}

/* libjvm's handle; not RTLD_DEFAULT, which is NULL and reads as "not found". */
static void *jvm_handle(void)
{
	char path[512] = "";

	dl_iterate_phdr(find_libjvm, path);
	return path[0] ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
}

static int sym_u64(void *h, const char *name, uint64_t *out)
{
	uint64_t *p = dlsym(h, name);
	if (!p)
		return -ENOENT;
	*out = *p;
	return 0;
}

int fm_vms_init(char *err, size_t errlen)
{
	struct field *want[] = { &f_collected_heap, &f_reserved, &f_mr_start, &f_mr_words,
				 &f_flag_name, &f_flag_addr, &f_flag_bits, &f_flags, &f_num_flags };
	uint64_t stride, o_type, o_field, o_static, o_off, o_addr, t_stride, t_name, t_size;
	char **structs, **types;
	void *h;

	if (ready)
		return 0;
	h = jvm_handle();
	if (!h) {
		snprintf(err, errlen, "libjvm.so exports no gHotSpotVMStructs: not a HotSpot JVM");
		return -ENOENT;
	}
	structs = dlsym(h, "gHotSpotVMStructs");
	types = dlsym(h, "gHotSpotVMTypes");
	if (!structs || !*structs || !types || !*types ||
	    sym_u64(h, "gHotSpotVMStructEntryArrayStride", &stride) ||
	    sym_u64(h, "gHotSpotVMStructEntryTypeNameOffset", &o_type) ||
	    sym_u64(h, "gHotSpotVMStructEntryFieldNameOffset", &o_field) ||
	    sym_u64(h, "gHotSpotVMStructEntryIsStaticOffset", &o_static) ||
	    sym_u64(h, "gHotSpotVMStructEntryOffsetOffset", &o_off) ||
	    sym_u64(h, "gHotSpotVMStructEntryAddressOffset", &o_addr) ||
	    sym_u64(h, "gHotSpotVMTypeEntryArrayStride", &t_stride) ||
	    sym_u64(h, "gHotSpotVMTypeEntryTypeNameOffset", &t_name) ||
	    sym_u64(h, "gHotSpotVMTypeEntrySizeOffset", &t_size) || !stride || !t_stride) {
		snprintf(err, errlen, "this JVM's VMStructs tables are incomplete: not a HotSpot JVM farmem can read");
		return -ENOENT;
	}
	t_structs = *structs;
	t_types = *types;
	s_stride = stride, s_type = o_type, s_field = o_field, s_static = o_static, s_off = o_off,
	s_addr = o_addr;
	ty_stride = t_stride, ty_name = t_name, ty_size = t_size;
	{
		char **ints = dlsym(h, "gHotSpotVMIntConstants");
		if (ints && *ints && !sym_u64(h, "gHotSpotVMIntConstantEntryArrayStride", &i_stride) &&
		    !sym_u64(h, "gHotSpotVMIntConstantEntryNameOffset", &i_name) &&
		    !sym_u64(h, "gHotSpotVMIntConstantEntryValueOffset", &i_value) && i_stride)
			t_ints = *ints;
	}
	for (const char *e = *structs;; e += stride) {
		const char *tn = *(const char *const *)(e + o_type);
		const char *fn = *(const char *const *)(e + o_field);
		if (!tn)
			break;
		if (!fn)
			continue;
		for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
			if (want[i]->offset >= 0 || strcmp(tn, want[i]->type) || strcmp(fn, want[i]->name))
				continue;
			if (*(const int32_t *)(e + o_static))
				want[i]->address = *(const uintptr_t *)(e + o_addr);
			want[i]->offset = (int64_t)*(const uint64_t *)(e + o_off);
		}
	}
	for (const char *e = *types;; e += t_stride) {
		const char *tn = *(const char *const *)(e + t_name);
		if (!tn)
			break;
		if (!strcmp(tn, "JVMFlag"))
			flag_size = (int64_t)*(const uint64_t *)(e + t_size);
	}
	ready = 1;
	return 0;
}

int fm_vms_heap(uintptr_t *start, uint64_t *bytes, char *err, size_t errlen)
{
	uintptr_t heap;
	const char *mr;

	if (!ready || !f_collected_heap.address || f_reserved.offset < 0 || f_mr_start.offset < 0 ||
	    f_mr_words.offset < 0) {
		snprintf(err, errlen, "this JVM's VMStructs do not describe CollectedHeap::_reserved: "
			 "cannot find the Java heap");
		return -ENOENT;
	}
	heap = *(const uintptr_t *)f_collected_heap.address;
	if (!heap) {
		snprintf(err, errlen, "the Java heap does not exist yet (Universe::_collectedHeap is NULL)");
		return -EAGAIN;
	}
	mr = (const char *)heap + f_reserved.offset;
	*start = *(const uintptr_t *)(mr + f_mr_start.offset);
	*bytes = (uint64_t)*(const size_t *)(mr + f_mr_words.offset) * sizeof(void *);
	if (!*start || !*bytes || (*start | *bytes) & 4095) {
		snprintf(err, errlen, "the Java heap's bounds read as %#lx+%llu: not page-aligned, refusing",
			 (unsigned long)*start, (unsigned long long)*bytes);
		return -EINVAL;
	}
	return 0;
}

/* JVMFlag::flags[i] named name, or NULL. */
static const char *find_flag(const char *name)
{
	const char *table;
	size_t n;

	if (!ready || flag_size <= 0 || !f_flags.address || !f_num_flags.address ||
	    f_flag_name.offset < 0 || f_flag_addr.offset < 0)
		return NULL;
	table = *(const char *const *)f_flags.address;
	n = *(const size_t *)f_num_flags.address;
	for (size_t i = 0; table && i < n; i++) {
		const char *f = table + i * (size_t)flag_size;
		const char *fn = *(const char *const *)(f + f_flag_name.offset);
		if (fn && !strcmp(fn, name))
			return f;
	}
	return NULL;
}

int fm_vms_flag_addr(const char *name, const void **addr)
{
	const char *f = find_flag(name);

	if (!f)
		return -ENOENT;
	*addr = *(const void *const *)(f + f_flag_addr.offset);
	return *addr ? 0 : -ENOENT;
}

int fm_vms_flag_user_set(const char *name)
{
	int32_t mask, cmdline, dflt, ergo, internal;
	const char *f = find_flag(name);
	int32_t bits;

	if (!f || f_flag_bits.offset < 0 || fm_vms_int_constant("JVMFlag::VALUE_ORIGIN_MASK", &mask) ||
	    fm_vms_int_constant("JVMFlag::WAS_SET_ON_COMMAND_LINE", &cmdline) ||
	    fm_vms_int_constant("JVMFlagOrigin::DEFAULT", &dflt) ||
	    fm_vms_int_constant("JVMFlagOrigin::ERGONOMIC", &ergo) ||
	    fm_vms_int_constant("JVMFlagOrigin::INTERNAL", &internal))
		return -ENOENT;
	bits = *(const int32_t *)(f + f_flag_bits.offset);
	if (bits & cmdline)
		return 1;
	bits &= mask;
	return bits != dflt && bits != ergo && bits != internal;
}

int fm_vms_flag_set_as_cmdline(const char *name, uint64_t value)
{
	int32_t mask, cmdline, ergo;
	const char *f = find_flag(name);
	void *addr;
	int32_t *bits;

	if (!f || f_flag_bits.offset < 0 || fm_vms_int_constant("JVMFlag::VALUE_ORIGIN_MASK", &mask) ||
	    fm_vms_int_constant("JVMFlag::WAS_SET_ON_COMMAND_LINE", &cmdline) ||
	    fm_vms_int_constant("JVMFlagOrigin::ERGONOMIC", &ergo))
		return -ENOENT;
	addr = *(void *const *)(f + f_flag_addr.offset);
	if (!addr)
		return -ENOENT;
	*(uint64_t *)addr = value;
	bits = (int32_t *)(f + f_flag_bits.offset);
	*bits = (*bits & ~mask) | ergo | cmdline;
	return 0;
}

int fm_vms_flag_bool(const char *name)
{
	const void *a;
	return fm_vms_flag_addr(name, &a) ? 0 : *(const unsigned char *)a != 0;
}

int fm_vms_field(const char *type, const char *name, int64_t *offset, uintptr_t *address)
{
	if (!ready)
		return -ENOENT;
	for (const char *e = t_structs;; e += s_stride) {
		const char *tn = *(const char *const *)(e + s_type);
		const char *fn = *(const char *const *)(e + s_field);
		if (!tn)
			break;
		if (!fn || strcmp(tn, type) || strcmp(fn, name))
			continue;
		if (*(const int32_t *)(e + s_static)) {
			if (!address)
				return -ENOENT; /* asked for an offset, found a static */
			*address = *(const uintptr_t *)(e + s_addr);
			return *address ? 0 : -ENOENT;
		}
		if (!offset)
			return -ENOENT;
		*offset = (int64_t)*(const uint64_t *)(e + s_off);
		return 0;
	}
	return -ENOENT;
}

int fm_vms_type_size(const char *type, uint64_t *size)
{
	if (!ready)
		return -ENOENT;
	for (const char *e = t_types;; e += ty_stride) {
		const char *tn = *(const char *const *)(e + ty_name);
		if (!tn)
			break;
		if (!strcmp(tn, type)) {
			*size = *(const uint64_t *)(e + ty_size);
			return 0;
		}
	}
	return -ENOENT;
}

int fm_vms_int_constant(const char *name, int32_t *value)
{
	if (!ready || !t_ints)
		return -ENOENT;
	for (const char *e = t_ints;; e += i_stride) {
		const char *n = *(const char *const *)(e + i_name);
		if (!n)
			break;
		if (!strcmp(n, name)) {
			*value = *(const int32_t *)(e + i_value);
			return 0;
		}
	}
	return -ENOENT;
}
