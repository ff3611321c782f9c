/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fm_layout: print the residency map's layout and latency buckets as the C compiler sees
 * them, as JSON. tests/test_cli.py compares it with the ctypes mirror in
 * cli/src/farmem/resmap.py, so that a change to uffd/resmap.h cannot silently skew
 * `farmem stat` and the `farmem run` summary.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>

#include "resmap.h"

int main(void)
{
	static const uint64_t samples[] = { 0, 1, 7, 8, 9, 15, 16, 17, 100, 1000, 4095, 4096,
					    12345, 1000000, 123456789, 1ull << 40, UINT64_MAX };

	printf("{\n");
	printf("  \"sizeof_hdr\": %zu,\n", sizeof(struct fm_resmap_hdr));
	printf("  \"offsetof_stats\": %zu,\n", offsetof(struct fm_resmap_hdr, stats));
	printf("  \"offsetof_regions\": %zu,\n", offsetof(struct fm_resmap_hdr, regions));
	printf("  \"offsetof_more_regions\": %zu,\n", offsetof(struct fm_resmap_hdr, more_regions));
	printf("  \"offsetof_swap_epoch\": %zu,\n", offsetof(struct fm_resmap_hdr, swap_epoch));
	printf("  \"offsetof_nregions\": %zu,\n", offsetof(struct fm_resmap_hdr, nregions));
	printf("  \"offsetof_lat_hist\": %zu,\n", offsetof(struct fm_pager_stats, lat_hist));
	/* Counters after lat_hist take reserved words: a few of them, placed as Python places them. */
	printf("  \"offsetof_swapva_pages_remote\": %zu,\n", offsetof(struct fm_pager_stats, swapva_pages_remote));
	printf("  \"offsetof_swapva_remote_copied\": %zu,\n", offsetof(struct fm_pager_stats, swapva_remote_copied));
	printf("  \"offsetof_swapva_copy_calls\": %zu,\n", offsetof(struct fm_pager_stats, swapva_copy_calls));
	printf("  \"offsetof_fault_mode\": %zu,\n", offsetof(struct fm_pager_stats, fault_mode));
	printf("  \"offsetof_garbage_reused\": %zu,\n", offsetof(struct fm_pager_stats, garbage_reused));
	printf("  \"offsetof_adopt_evictions\": %zu,\n", offsetof(struct fm_pager_stats, adopt_evictions));
	printf("  \"offsetof_forks_without_paged\": %zu,\n", offsetof(struct fm_pager_stats, forks_without_paged));
	printf("  \"offsetof_evictions_captured\": %zu,\n", offsetof(struct fm_pager_stats, evictions_captured));
	printf("  \"offsetof_gc_conc_faults\": %zu,\n", offsetof(struct fm_pager_stats, gc_conc_faults));
	printf("  \"offsetof_discard_released\": %zu,\n", offsetof(struct fm_pager_stats, discard_released));
	printf("  \"offsetof_evictions_in_place\": %zu,\n", offsetof(struct fm_pager_stats, evictions_in_place));
	printf("  \"offsetof_refaults_soon\": %zu,\n", offsetof(struct fm_pager_stats, refaults_soon));
	printf("  \"offsetof_heap_faults\": %zu,\n", offsetof(struct fm_pager_stats, heap_faults));
	printf("  \"offsetof_peak_limit_pages\": %zu,\n", offsetof(struct fm_pager_stats, peak_limit_pages));
	printf("  \"offsetof_refused_bytes\": %zu,\n", offsetof(struct fm_pager_stats, refused_bytes));
	printf("  \"offsetof_refaults_3budgets\": %zu,\n", offsetof(struct fm_pager_stats, refaults_3budgets));
	printf("  \"offsetof_peak_registered_pages\": %zu,\n", offsetof(struct fm_pager_stats, peak_registered_pages));
	printf("  \"offsetof_evict_pinned\": %zu,\n", offsetof(struct fm_pager_stats, evict_pinned));
	printf("  \"offsetof_pins_refused\": %zu,\n", offsetof(struct fm_pager_stats, pins_refused));
	printf("  \"offsetof_lend_requests\": %zu,\n", offsetof(struct fm_pager_stats, lend_requests));
	printf("  \"offsetof_spin_crowded\": %zu,\n", offsetof(struct fm_pager_stats, spin_crowded));
	printf("  \"offsetof_helped_faults\": %zu,\n", offsetof(struct fm_pager_stats, helped_faults));
	printf("  \"offsetof_loop_evictions\": %zu,\n", offsetof(struct fm_pager_stats, loop_evictions));
	printf("  \"offsetof_loop_back_run\": %zu,\n", offsetof(struct fm_pager_stats, loop_back_run));
	printf("  \"offsetof_loop_back_random\": %zu,\n", offsetof(struct fm_pager_stats, loop_back_random));
	printf("  \"offsetof_over_budget_adopted\": %zu,\n", offsetof(struct fm_pager_stats, over_budget_adopted));
	printf("  \"offsetof_object_reads\": %zu,\n", offsetof(struct fm_pager_stats, object_reads));
	printf("  \"offsetof_remark_pauses\": %zu,\n", offsetof(struct fm_pager_stats, remark_pauses));
	printf("  \"offsetof_referent_reads\": %zu,\n", offsetof(struct fm_pager_stats, referent_reads));
	printf("  \"sizeof_region\": %zu,\n", sizeof(struct fm_resmap_region));
	printf("  \"sizeof_stats\": %zu,\n", sizeof(struct fm_pager_stats));
	printf("  \"magic\": %u,\n", FM_RESMAP_MAGIC);
	printf("  \"version\": %u,\n", FM_RESMAP_VERSION);
	printf("  \"map_offset\": %u,\n", FM_RESMAP_MAP_OFFSET);
	printf("  \"lat_floor\": [");
	for (unsigned b = 0; b < FM_LAT_BUCKETS; b++)
		printf("%s%" PRIu64, b ? ", " : "", fm_lat_bucket_floor(b));
	printf("],\n");
	printf("  \"lat_bucket\": [");
	for (size_t i = 0; i < sizeof(samples) / sizeof(samples[0]); i++)
		printf("%s[%" PRIu64 ", %u]", i ? ", " : "", samples[i], fm_lat_bucket(samples[i]));
	printf("]\n}\n");
	return 0;
}
