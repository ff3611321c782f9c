// SPDX-License-Identifier: Apache-2.0
/* Interposing on a loaded library's imports through its GOT (got.h). */
#include "got.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_SLOTS 8

struct search {
	const char *lib, *sym;
	int found;                    /* the library is loaded */
	uintptr_t lo, hi;             /* its loaded segments */
	uintptr_t relro_lo, relro_hi; /* read-only after relocation: mprotect to write */
	void **slots[MAX_SLOTS];
	int nslots;
};

/* glibc relocates most d_ptr entries in place when it loads an object; some ports do not. */
static uintptr_t dyn_ptr(const struct dl_phdr_info *info, ElfW(Addr) v)
{
	return v < info->dlpi_addr ? info->dlpi_addr + v : v;
}

static void scan_relocs(struct search *s, const struct dl_phdr_info *info, const ElfW(Rela) *rel, size_t bytes,
			const ElfW(Sym) *symtab, const char *strtab)
{
	for (size_t k = 0; k < bytes / sizeof(*rel) && s->nslots < MAX_SLOTS; k++) {
		unsigned long type = ELF64_R_TYPE(rel[k].r_info), idx = ELF64_R_SYM(rel[k].r_info);
		if ((type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) || !idx)
			continue;
		if (!strcmp(strtab + symtab[idx].st_name, s->sym))
			s->slots[s->nslots++] = (void **)(info->dlpi_addr + rel[k].r_offset);
	}
}

static int visit(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct search *s = arg;
	const char *base = strrchr(info->dlpi_name, '/');
	const ElfW(Dyn) *dyn = NULL;
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const ElfW(Rela) *jmprel = NULL, *rela = NULL;
	size_t pltrelsz = 0, relasz = 0;

	base = base ? base + 1 : info->dlpi_name;
	if (strcmp(base, s->lib))
		return 0;
	s->found = 1;
	s->lo = UINTPTR_MAX;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t a = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)a;
		else if (ph->p_type == PT_GNU_RELRO)
			s->relro_lo = a, s->relro_hi = a + ph->p_memsz;
		else if (ph->p_type == PT_LOAD) {
			s->lo = a < s->lo ? a : s->lo;
			s->hi = a + ph->p_memsz > s->hi ? a + ph->p_memsz : s->hi;
		}
	}
	for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(info, dyn->d_un.d_ptr); break;
		case DT_STRTAB: strtab = (const char *)dyn_ptr(info, dyn->d_un.d_ptr); break;
		case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_ptr(info, dyn->d_un.d_ptr); break;
		case DT_PLTRELSZ: pltrelsz = dyn->d_un.d_val; break;
		case DT_RELA: rela = (const ElfW(Rela) *)dyn_ptr(info, dyn->d_un.d_ptr); break;
		case DT_RELASZ: relasz = dyn->d_un.d_val; break;
		default: break;
		}
	}
	if (symtab && strtab) {
		if (jmprel)
			scan_relocs(s, info, jmprel, pltrelsz, symtab, strtab);
		if (rela)
			scan_relocs(s, info, rela, relasz, symtab, strtab);
	}
	return 1;
}

static int store(const struct search *s, void **slot, void *fn)
{
	uintptr_t page = (uintptr_t)slot & ~(uintptr_t)(getpagesize() - 1);
	int ro = (uintptr_t)slot >= s->relro_lo && (uintptr_t)slot < s->relro_hi;

	if (ro && mprotect((void *)page, (size_t)getpagesize(), PROT_READ | PROT_WRITE))
		return -errno;
	__atomic_store_n(slot, fn, __ATOMIC_RELEASE);
	if (ro && mprotect((void *)page, (size_t)getpagesize(), PROT_READ))
		return -errno;
	return 0;
}

int fm_got_interpose(const char *lib, const char *sym, void *fn, void **orig)
{
	struct search s = { .lib = lib, .sym = sym };
	void *was;
	int rc;

	dl_iterate_phdr(visit, &s);
	if (!s.found)
		return -ENOENT;
	if (!s.nslots)
		return 0;
	was = __atomic_load_n(s.slots[0], __ATOMIC_ACQUIRE);
	/*
	 * A lazily bound slot still points into the library's own PLT, whose
	 * resolver would write the slot back; the symbol's definition is what
	 * the resolver would have found. Any other value (the definition, or
	 * another tool's hook) is kept and called.
	 */
	if ((uintptr_t)was >= s.lo && (uintptr_t)was < s.hi)
		was = dlsym(RTLD_DEFAULT, sym);
	if (!was || was == fn)
		return was ? s.nslots : -ENOENT;
	*orig = was;
	for (int k = 0; k < s.nslots; k++)
		if ((rc = store(&s, s.slots[k], fn)))
			return rc;
	return s.nslots;
}
