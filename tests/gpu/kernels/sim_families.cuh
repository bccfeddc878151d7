// sim_families.cuh: the simulations' family and kernel tables (slots, names, rules, launch
// plans, kernels), every one built from kernels/ear_families.h, which the library's tests write
// from src/launch/family.rs: a new family needs nothing here. Part of sim_common.cuh.
#pragma once

// Every family's kernel sources, ids and rows.
#define EAR_INCLUDE_FAMILY_SOURCES
#include "../../../kernels/ear_families.h"

// The simulated plain kernels, a slot each: a family's slot is its id and runs its 2-rank kernel
// at every N (the 2-rank two-shot too). The slot of EAR_FAMILY_NORM, an id no family has, runs
// the 4+ rank two-shot (twoshot_wide.cu) at every N: the cases keep their order, and so their
// names, which the GPU runs are compared by. The sweeps go over every slot; these names are for
// the cases written by hand.
enum Fam : int {
  ONESHOT = EAR_FAMILY_ONESHOT,
  TWOSHOT = EAR_FAMILY_TWOSHOT,
  LAMPORT = EAR_FAMILY_LAMPORT,
  WIDE = EAR_FAMILY_NORM,
  PUSH = EAR_FAMILY_PUSH
};
#define EAR_SIM_ONE_(...) +1
constexpr int kFams = 1 EAR_FOR_EACH_FAMILY(EAR_SIM_ONE_);  // the families and WIDE
#undef EAR_SIM_ONE_
// The library's family id of a plain slot (the launch plan's EarPlan::family).
static int32_t plan_family(int fam) { return fam == WIDE ? TWOSHOT : fam; }

constexpr bool sim_same(const char* a, const char* b) { return *a == *b && (*a == '\0' || sim_same(a + 1, b + 1)); }
// Ids index the tables (the library's tests check them too); only the two-shot has a kernel of
// its own at 4 and more ranks, which WIDE simulates.
#define EAR_SIM_CHECK_(name, id, plain2, plainwide, ...)                                   \
  static_assert(id >= 0 && id < kFams && id != WIDE,                                     \
                #name ": ids run from 0 with no gap but EAR_FAMILY_NORM's");              \
  static_assert(id == TWOSHOT || sim_same(#plain2, #plainwide),                          \
                #name ": a kernel of its own at 4 and more ranks: give it a slot as WIDE is the two-shot's");
EAR_FOR_EACH_FAMILY(EAR_SIM_CHECK_)
#undef EAR_SIM_CHECK_

// The launch rules of the library's family `id` (EAR_FAMILY_*), from its description.
static EarRule sim_rule(int32_t id) {
#define EAR_SIM_RULE_(name, fid, plain2, plainwide, fused, grid, fgrid, cap, fit, flags, ...) \
  if (id == fid) return EarRule{grid, fgrid, cap, fit, flags};
  EAR_FOR_EACH_FAMILY(EAR_SIM_RULE_)
#undef EAR_SIM_RULE_
  std::printf("no family %d in kernels/ear_families.h\n", id);
  std::_Exit(2);
}

// What a rank knows of a plain call besides its size (the library's EarCallFacts).
static EarCallFacts sim_facts(bool exchanges_pointers, bool in_place, bool input_reachable) {
  EarCallFacts f = {};
  f.exchanges_pointers = exchanges_pointers;
  f.in_place = in_place;
  f.input_reachable = input_reachable;
  return f;
}

// The library's plan of one call of family `id` (grid, block and flags: ear_plan_of on its rule).
static EarPlan sim_plan(int32_t id, int32_t op, uint64_t count, uint64_t tokens, uint32_t hidden, uint32_t elem,
                        int32_t nranks, uint32_t max_blocks, EarCallFacts facts = EarCallFacts{}) {
  return ear_plan_of(sim_rule(id), id, op, count, tokens, hidden, elem, nranks, max_blocks, facts);
}

// Kernel tables

static int n_index(int n) {
  switch (n) {
    case 2: return 0;
    case 4: return 1;
    case 6: return 2;
    case 8: return 3;
    case 16: return 4;
  }
  std::printf("unsupported N=%d\n", n);
  std::_Exit(2);
}

// The five rank counts of one extern "C" kernel and type: ear_<stem>_<t>_n<N>; every type.
#define EAR_ROW(stem, t) \
  {(const void*)ear_##stem##_##t##_n2, (const void*)ear_##stem##_##t##_n4, \
   (const void*)ear_##stem##_##t##_n6, (const void*)ear_##stem##_##t##_n8, \
   (const void*)ear_##stem##_##t##_n16}
#define EAR_ROWS(stem) {EAR_ROW(stem, f32), EAR_ROW(stem, f16), EAR_ROW(stem, bf16)}
// The same for a harness template KERNEL<T, N, FAM> (the all-ranks-in-one-launch kernels).
#define SIM_ROW(KERNEL, FAM, T) \
  {(const void*)KERNEL<T, 2, FAM>, (const void*)KERNEL<T, 4, FAM>, (const void*)KERNEL<T, 6, FAM>, \
   (const void*)KERNEL<T, 8, FAM>, (const void*)KERNEL<T, 16, FAM>}
#define SIM_TABLE_ROW(KERNEL, FAM) \
  {SIM_ROW(KERNEL, FAM, float), SIM_ROW(KERNEL, FAM, __half), SIM_ROW(KERNEL, FAM, __nv_bfloat16)}
// A kernel of every type (F32, F16, BF16) and rank count (n_index).
using KernelRow = const void* [3][5];
static void sim_fill(KernelRow& dst, const void* const (&src)[3][5]) { std::memcpy(dst, src, sizeof dst); }

// By slot: names and plain kernels; by family id: fused kernels and their names (none at
// EAR_FAMILY_NORM, the norm kernel alone).
struct SimTables {
  const char* name[kFams];
  KernelRow plain[kFams];
  const char* fused_name[kFams];
  KernelRow fused[kFams];
};
static const SimTables kSim = [] {
  SimTables t{};
#define EAR_SIM_TABLES_(name_, id, plain2, plainwide, fused_, ...) \
  t.name[id] = #name_;                                              \
  sim_fill(t.plain[id], EAR_ROWS(plain2));                          \
  t.fused_name[id] = #name_ "_norm";                                \
  sim_fill(t.fused[id], EAR_ROWS(fused_));                          \
  if (id == TWOSHOT) {                                              \
    t.name[WIDE] = #name_ "_wide";                                  \
    sim_fill(t.plain[WIDE], EAR_ROWS(plainwide));                   \
  }
  EAR_FOR_EACH_FAMILY(EAR_SIM_TABLES_)
#undef EAR_SIM_TABLES_
  return t;
}();
static const auto& kFamName = kSim.name;
static const auto& kKernels = kSim.plain;
static const auto& kFusedKernels = kSim.fused;

// The largest plain message of slot `fam` in workspaces made for m bytes (its capacity rule).
static uint64_t sim_max_msg(int fam, uint64_t m) { return ear_max_msg_of(sim_rule(plan_family(fam)).capacity, m); }
