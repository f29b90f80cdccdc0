// How the Hopper backward-weight kernels spread their units of dW over a wave of CTAs. Plain C++,
// compiled into the kernels (NVRTC) and into the generator, which sizes the workspace and predicts
// each candidate's time from the same schedule.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define BSJIT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define BSJIT_HOST_DEVICE inline
#endif

namespace bsjit {
namespace kernels {

// The workspace of the backward-weight kernels that split along N (SddSchedule's pieces here, and
// the mma.sync kernel's splits): kSplitCounters arrival counters (unsigned), then the fp32 partial
// planes. Every kernel finds its counters at the same place and leaves those it used at 0, so one
// workspace serves every kernel launched in turn on a stream: the runtime keeps one per context and
// stream, sized for the largest (before, one per kernel each placed its counters after its own
// planes, where another kernel's partials lay). The generator checks that a kernel's counters fit.
inline constexpr int kSplitCounters = 4096;

// The last kWaveGateCounters of those counters belong to WaveGate (matmul_hopper.cuh): the round
// counters of the persistent kernels' wave, then its finish counter. The split counters of any
// kernel stay below them.
inline constexpr int kWaveGateRounds = 16;
inline constexpr int kWaveGateCounters = kWaveGateRounds + 1;
// How far a CTA may run ahead of the slowest, in rounds, and a backward-weight round's steps (of 64
// rows of N): the kernels and the runtime, which passes no workspace where the gate would not wait.
inline constexpr int kWaveGateLead = 2;
inline constexpr int kWaveGateSteps = 8;
inline constexpr int kPieceCounters = kSplitCounters - kWaveGateCounters;

// One unit's share of a CTA's work: steps [first, last) of 64 rows of N; piece < 0: the whole unit.
struct SddItem {
  int unit, first, last, piece;
};

// `units` units over `ctas` CTAs (at most the GPU holds at once), `steps` steps each. Whole units in
// waves: CTA p takes units p, p + P, ..., so a wave's CTAs walk N together and read the rows of X
// and dY they share from L2. The L units left after the full waves are split along N into q pieces
// each (q = P / L, at most kMaxPieces; q = 1: taken whole), for the CTAs that would otherwise idle in
// the last wave; each piece writes its fp32 partial and the last piece of a unit to finish adds them
// in piece order (deterministic). Workspace: one arrival counter per leftover unit (the first L of
// the kSplitCounters), which the last piece sets back to 0, then `planes` planes of partials (piece j
// of leftover unit r at r·q + j).
// Not split where P < 2L. There a head of each leftover unit (m / (m + 1) of its steps, on its own
// CTA) and its tail (on one of the other P - L CTAs, m = ceil(L / (P - L)) tails each) would cut the
// last wave to m / (m + 1) of a unit, and were slower: with 96 units of b = 128 on 132 CTAs at
// d = 0.1 the tails walk the end of N apart from the heads and read 23 MB more from DRAM (132 → 155
// MB, Nsight Compute), while L2 already ran at 83% of its peak with 96 CTAs. Suite W, TFLOP/s:
// balanced b = 128 d = 0.1 447-462 → 408-415, Bernoulli 531 → 415, balanced b = 64 d = 0.05 255 → 209
// (H200, 2026-12-01; docs/PERFORMANCE.md, "Tried and not kept").
struct SddSchedule {
  static constexpr int kMaxPieces = 8;
  int ctas, steps, waves, left, q;

  BSJIT_HOST_DEVICE SddSchedule(int units, int ctas_, int planes, int steps_)
      : ctas(ctas_), steps(steps_), waves(units / ctas_), left(units % ctas_), q(1) {
    if (left == 0) return;
    q = min_of(min_of(kMaxPieces, ctas / left), min_of(steps, planes / left));
    if (q < 1) q = 1;
  }
  // Partial planes the split uses.
  BSJIT_HOST_DEVICE int planes() const { return q > 1 ? left * q : 0; }
  // The rounds a whole unit makes when paced (WaveGate: kWaveGateSteps steps each), and the rounds
  // every CTA has (its whole waves'; the leftover pieces are not paced).
  BSJIT_HOST_DEVICE int unit_rounds() const { return (steps + kWaveGateSteps - 1) / kWaveGateSteps; }
  BSJIT_HOST_DEVICE int paced_rounds() const { return waves * unit_rounds(); }
  // Items of CTA p.
  BSJIT_HOST_DEVICE int items(int p) const { return waves + (p < left * q ? 1 : 0); }
  // Item i of CTA p.
  BSJIT_HOST_DEVICE SddItem item(int p, int i) const {
    if (i < waves) return {p + i * ctas, 0, steps, -1};
    const int unit = waves * ctas + p % left;
    if (q == 1) return {unit, 0, steps, -1};
    const int chunk = (steps + q - 1) / q, first = min_of(steps, (p / left) * chunk);
    return {unit, first, min_of(steps, first + chunk), p / left};
  }
  // The leftover index of a piece's unit (its planes and counter).
  BSJIT_HOST_DEVICE int leftover(const SddItem& item) const { return item.unit - waves * ctas; }

 private:
  BSJIT_HOST_DEVICE static int min_of(int a, int b) { return a < b ? a : b; }
};

}  // namespace kernels
}  // namespace bsjit
