/* cost.h: the cost model — hardware profiles, op and collective time, per-device memory, step estimate.
 *
 *   HwProfile hw;
 *   if (hw_profile_resolve(&hw, "tpu-v3", NULL, pos, &diag) != 0) ...;
 *   CostEstimate e;
 *   cost_estimate(&prog, &hw, &e);        // prog: partition()'s output
 *   printf("%g s per step, %g s overlapped, peak %lld bytes at op %d\n",
 *          e.serial_s, e.overlapped_s, (long long)e.mem.peak, e.mem.peak_op);
 *   cost_estimate_free(&e);
 *
 * Every formula is in docs/cost_model.md; the profile format and the sources
 * of the built-in figures are in docs/hardware.md.  Times are seconds, sizes
 * bytes, rates per second.  Everything is per device of an SPMD program:
 * every device runs the same program on its own shards. */
#ifndef SPMD_COST_H
#define SPMD_COST_H

#include "../spmd/ir.h"
#include "../sharding_spec/reshard.h"

/* ---- hardware profiles (profiles.c) ---- */

/* TOPO_THREADS: the thread backend (runtime/threads.c): devices share
 * memory and every collective waits at barriers of all devices. */
typedef enum { TOPO_RING, TOPO_TORUS, TOPO_SWITCH, TOPO_THREADS, TOPO_COUNT } HwTopology;
extern const char *const hw_topology_names[TOPO_COUNT]; /* "ring", "torus", "switch", "threads" */

enum { HW_MAX_DIMS = 4 };

/* How many collectives a device runs at once: one per set of links they
 * occupy (collectives on disjoint links overlap each other), or one. */
typedef enum { COMM_LINKS, COMM_ONE, COMM_STREAMS_COUNT } CommStreams;

typedef struct {
	char name[64];
	double flops[DT_COUNT];  /* peak FLOP/s of matrix ops (einsum, conv2d) per dtype */
	double vector_flops;     /* elementwise FLOP/s; 0: the f32 peak */
	double transcendentals;  /* exp, log, tanh, ... per second; 0: vector_flops */
	double mem_bw;           /* memory bandwidth, bytes/s */
	double mem_capacity;     /* memory per device, bytes */
	double kernel_overhead;  /* seconds per kernel (an op, or a fused group) */
	double matrix_overhead;  /* seconds per einsum or conv2d kernel; 0: kernel_overhead */
	double collective_overhead; /* seconds per collective call (launch, synchronisation), beside its steps' latency */
	bool fusion;             /* chains of elementwise ops run as one kernel */
	HwTopology topo;
	int ndims;               /* torus/ring: the full machine's dims; switch: 1 */
	int dims[HW_MAX_DIMS];   /* torus/ring dim sizes; switch: devices per switch domain */
	int wraparound;          /* torus: 0 a slice dim wraps only when it is the whole dim; k > 0: when a multiple of k */
	double link_bw;          /* bytes/s one way per link (switch: per device into the switch) */
	double latency;          /* alpha: seconds per collective step (threads: per barrier) */
	double dcn_bw;           /* bytes/s per device beyond the torus or switch domain */
	double dcn_latency;
	CommStreams comm_streams; /* collectives at once: one per set of links (default), or one */
	int host_cores;          /* local profiles: devices are threads sharing this many cores (0: separate chips) */
	double op_rate[OP_COUNT]; /* measured elements per second of an op kind (0: the roofline's compute term) */
	double op_overhead[OP_COUNT]; /* measured seconds per kernel of an op kind (0: kernel or matrix overhead) */
	double dispatch_overhead; /* local profiles: seconds per op the executor spends between kernels (0: none) */
	double dispatch_bw;      /* bytes/s at which it allocates results between kernels (0: mem_bw) */
	double im2col_copy;      /* seconds per contiguous copy of the executor's im2col (conv2d family; 0: none) */
	double matrix_element;   /* seconds per element of an einsum's operands and result (the executor's layout; 0: none) */
	double matrix_half_width; /* conv2d family: GEMM width N at which it runs at half the peak (0: the peak) */
} HwProfile;

/* The built-in profiles' names, NULL-terminated. */
const char *const *hw_profile_names(void);
/* Fill p with the built-in profile called name; 0, or -1 if there is none. */
int hw_profile_builtin(HwProfile *p, const char *name);
/* Parse a profile from YAML text (name: the file, for messages); 0, or -1
 * after reporting FILE:LINE:COL errors. */
int hw_profile_parse(HwProfile *p, const char *text, const char *name, Diag *d);
int hw_profile_load(HwProfile *p, const char *path, Diag *d);
/* A built-in name, or a profile file: as given, or relative to the model
 * file's folder (model may be NULL).  Unknown: an error at pos. */
int hw_profile_resolve(HwProfile *p, const char *arg, const char *model, Pos pos, Diag *d);
/* Write p in the format hw_profile_parse reads. */
void hw_profile_write(const HwProfile *p, FILE *out);
/* The fraction of the hardware one device of an ndev-device program gets:
 * min(1, host_cores / ndev) for local profiles, else 1.  Collectives run
 * at that share; local ops run at the full rate of one core, and a
 * collective waits for the devices that shared the cores meanwhile
 * (cost_estimate; docs/cost_model.md). */
double hw_share(const HwProfile *p, int ndev);

/* ---- one op (op_cost.c) ---- */

typedef struct {
	double flops;   /* arithmetic operations */
	double trans;   /* transcendental evaluations (exp, log, tanh, rsqrt, ...) */
	double bytes;   /* memory traffic: operands read once, the result written once */
	bool matrix;    /* einsum, conv2d: runs at the matrix peak */
	double elems;   /* elements of the larger of operand 0 and the result */
	int kind;       /* the op's OpKind */
	double copies;  /* conv2d family: contiguous copies the executor's im2col or col2im makes */
	double width;   /* conv2d family: N of its GEMM (M x K by K x N) */
	double layout;  /* einsum of two operands: elements of its operands and result */
} OpWork;

/* The work of local op i of graph g on its (local) shapes. */
void cost_op_work(const Graph *g, int i, OpWork *w);
/* Roofline time of work w in dtype dt on one device (ndev: unused, kept
 * for profiles that will depend on it):
 * max(flops / peak + trans / rate, bytes / bandwidth) + kernel overhead,
 * with elems / op_rate[kind] for the compute term when the profile
 * measured the op kind, and op_overhead[kind] for the overhead when it
 * measured that.  A conv2d's peak is scaled by N / (N + half width), and
 * its im2col copies are added to its compute term (docs/cost_model.md). */
double cost_roofline(const HwProfile *hw, DType dt, const OpWork *w, int ndev);
/* Its parts: the compute term of w, a kernel's time from a compute term
 * and the bytes it moves (with the measured overhead of op kind `kind`, or
 * with kind -1 the kernel or matrix overhead), and the executor's time
 * between kernels for an op whose result has out_bytes (0 on profiles
 * without a dispatch_overhead). */
double cost_compute_seconds(const HwProfile *hw, DType dt, const OpWork *w);
double cost_kernel_seconds(const HwProfile *hw, double compute, double bytes, bool matrix, int kind);
double cost_dispatch_seconds(const HwProfile *hw, double out_bytes);
/* Elementwise fusion: group[i] gets the first op of i's fused chain (i
 * itself when it is not fused).  Ops fuse when both are elementwise with a
 * result of the same element count and the first's result is read only by
 * the second.  Returns the number of kernels. */
int cost_fusion_groups(const Graph *g, int *group);

/* ---- collectives (collective_cost.c) ---- */

/* One ring of a collective's decomposition: n devices, a step costs alpha,
 * a byte 1/bw; wrap: a closed torus ring (bidirectional); line: no wrap;
 * sw: on a switch (all-to-all at full bandwidth). */
typedef struct {
	int n;
	double bw, alpha;
	bool wrap, sw;
	int hop;  /* distance between neighbours of the ring in its torus dim */
	int link; /* the links it runs on: its slice dim, HW_MAX_DIMS the DCN, -1 every link (a line not on the dims) */
} CostRing;

/* The rings a collective over the mesh axes axes[0..nax) runs on, fastest
 * first.  Returns their number (at most 2 * MESH_MAX_AXES + 2). */
int cost_rings(const HwProfile *hw, const Mesh *m, const int *axes, int nax, CostRing *ring);
/* Time of a collective of kind k over the given mesh axes, when each device
 * hands in `bytes` (permute: target as in Attr, or NULL with shift along
 * axes[0]). */
double cost_collective_seconds(const HwProfile *hw, const Mesh *m, ReshardKind k, const int *axes, int nax,
                               double bytes, const int *target, int64_t shift);
/* The same for collective op i of a partitioned program. */
double cost_collective_op(const HwProfile *hw, const Graph *g, int i);
/* The links collective op i of a partitioned program occupies while it
 * runs, as a set of COST_LINKS bits: bits 2j and 2j + 1 the two ways of
 * dim j of the devices' slice of the machine (a torus dim; a switch's
 * domain), bit 2 * HW_MAX_DIMS the DCN beyond it (docs/cost_model.md,
 * "The step").  A ring collective uses both ways; a permute by a shift
 * along one axis only the way it sends on a closed torus ring.
 * Collectives whose sets are disjoint run at once.  Every bit: a permute
 * to explicit targets, a group not on the slice's dims. */
enum { COST_LINKS = 2 * HW_MAX_DIMS + 1 };
/* Which way a set of links sends when it holds one way of a dim only (a
 * shift round a closed ring): +1 to c + 1, -1 to c - 1; else 0. */
int cost_links_way(unsigned links);
unsigned cost_collective_links(const HwProfile *hw, const Graph *g, int i);
/* Time of a reshard plan (sum of its steps; slices as memory copies). */
double cost_reshard_seconds(const HwProfile *hw, const Mesh *m, const ReshardPlan *p);
/* Barriers the thread backend's collective of kind k waits at. */
int cost_thread_barriers(ReshardKind k);
/* Formulas on one ring (exposed for tests): B bytes handed in. */
double cost_ring_all_reduce(const CostRing *r, double B);
double cost_ring_reduce_scatter(const CostRing *r, double B);
double cost_ring_all_gather(const CostRing *r, double B);
double cost_ring_all_to_all(const CostRing *r, double B);

/* ---- memory (memory.c) ---- */

typedef struct {
	int64_t params, state, inputs; /* held the whole step (inputs: and constants) */
	int64_t peak;                  /* the most held at once */
	int peak_op;                   /* op at which it occurs, -1: before any */
	int64_t peak_activations;      /* at the peak: live op results ... */
	int64_t peak_collective;       /* ... of which collective results */
} MemoryEstimate;

/* Liveness over g's program order: leaves are held throughout; an op's
 * result from its op until its last use (outputs: to the end).  The peak is
 * taken after each op's result is allocated, before its operands are freed
 * (as runtime/exec.c holds them). */
void cost_memory(const Graph *g, MemoryEstimate *m);
/* Memory over time, by the same liveness: held[i] (g->ops.n entries) the
 * bytes held just after op i's result is allocated. */
void cost_memory_timeline(const Graph *g, int64_t *held);
/* A floor under the peak of every partitioned program of g, a loaded model
 * (not partitioned) whose annotations name its mesh: the params and inputs
 * a device must hold the whole step, counted only as far as their
 * annotations fix them.  A param or input annotated on every dim at
 * priority 0 keeps that sharding (annotations are constraints), so it
 * holds at least its annotated tile; when some dims are open, or weight-
 * update sharding may store the param sharded further (g trains with wus
 * on, or the param says so), the axes the annotation leaves free could cut
 * that tile into at most their product, so it holds at least that share.
 * Unannotated values, optimizer state and activations count nothing.
 * explore prunes a mesh whose floor is over the capacity (cost_model.md). */
int64_t cost_memory_floor(const Graph *g, bool wus_on);
/* A floor under the peak per device of every partitioned program of g
 * over ndev devices, g a model as built (a training step: train_build),
 * not pipelined.  The leaves the program reads are held the whole step
 * (cost_memory).  A training step's partitioned program keeps the ops up
 * to the loss's before the rest (the partitioner and its passes move only
 * collectives, reshards and the weight update, which come after the
 * loss), so every result made up to the loss and read after it (what the
 * backward reads of the forward's) is held at once when the loss is made.
 * Each of those values is held whole across the devices, in some layout:
 * one device holds at least 1/ndev of their sum.  autoshard proves with it
 * that no plan of a mode fits (docs/autoshard.md); test builds check it
 * against every plan autoshard prices. */
int64_t cost_step_floor(const Graph *g, int ndev);
/* The op results held at op i (made at or before it, read at or after it,
 * or outputs): their value ids into vals (room for g->values.n); returns
 * how many.  At the peak op, they are what the peak is made of. */
int cost_live_values(const Graph *g, int i, int *vals);

/* ---- the step (estimate.c) ---- */

/* The phases of a training step (an inference program is all forward). */
typedef enum { PHASE_FORWARD, PHASE_BACKWARD, PHASE_GRAD_SYNC, PHASE_UPDATE, PHASE_GATHER, PHASE_COUNT } CostPhase;
extern const char *const cost_phase_names[PHASE_COUNT]; /* "forward", "backward", "gradient sync", ... */

/* What an op's time is spent on: the roofline's compute term, its memory
 * term, fixed costs (kernel overhead, collective steps' latency, the
 * executor between kernels), waiting for devices that share host cores,
 * or the links of mesh axis a (LIMIT_LINKS + a). */
enum { LIMIT_FLOPS, LIMIT_MEMORY, LIMIT_LATENCY, LIMIT_HOST, LIMIT_LINKS, LIMIT_COUNT = LIMIT_LINKS + MESH_MAX_AXES };

/* A program as one step of a long run: the phase of every op, and the
 * values each step hands to the next (the updated params and optimizer
 * state become the next step's leaves). */
typedef struct {
	unsigned char *phase;          /* per op: a CostPhase; NULL: every op forward */
	int ncarry;
	int *carry_from, *carry_to;    /* program value ids: carry_from[i] becomes leaf carry_to[i] */
	bool steady_only;              /* skip the first step's simulation (first_step_s is then 0) */
} CostStep;
void cost_step_free(CostStep *s);

typedef struct {
	double seconds;  /* this op's share of its kernel's time */
	bool comm;       /* a collective */
	int phase;       /* its CostPhase */
	double limit_s[LIMIT_COUNT]; /* seconds by what limits it; they sum to seconds */
	double start, end; /* in the steady-state schedule, from the start of the step (its first op) */
	double hidden;   /* collectives: seconds of it the compute stream is busy meanwhile (in any step) */
	int lane;        /* collectives: the communication stream it runs on, 0 .. nlanes - 1 (one per set of links) */
	unsigned links;  /* collectives: the links it occupies (cost_collective_links; every bit with one stream) */
	/* In the steady step (docs/cost_model.md, "Where the step waits"): */
	double wait;     /* compute ops: seconds the compute stream idles just before it */
	int wait_on;     /* ... the collective whose result it waited for (-1: none) */
	double delay;    /* collectives: seconds from its operands being ready to its start */
	int behind;      /* ... the collective that held its links until it started (-1: none) */
} OpEstimate;

/* One stream's op in the steady-state schedule, for pictures: op of the
 * step `step` (0: the first simulated) on stream comm, at [start, end). */
typedef struct {
	int op, step;
	bool comm;
	double start, end;
} CostSlot;

typedef struct {
	int nops;
	OpEstimate *op;
	int nkernels;
	double serial_s;      /* every op one after another */
	double overlapped_s;  /* steady state: the time per step of a long run, collectives on their own streams
	                       * overlapping compute of the same and the next step as data dependencies allow */
	int nlanes;           /* communication streams: one per set of links the collectives occupy (1: one) */
	double link_busy_s;   /* the busiest link's collective seconds a step (comm_s with one stream): no steady
	                       * step is shorter */
	double first_step_s;  /* the first step alone, on the same streams */
	double phase_s[PHASE_COUNT];      /* serial seconds per phase (they sum to serial_s) */
	double phase_hidden_s[PHASE_COUNT]; /* of which hidden under compute in the steady state */
	double phase_limit_s[PHASE_COUNT][LIMIT_COUNT]; /* per phase, seconds by what limits them */
	int nslots;
	CostSlot *slot;       /* the simulated steps' schedule, by start time per stream (docs/cost_model.md) */
	int nsteps_sim;       /* steps simulated */
	double step_origin[8]; /* when each simulated step's first op starts */
	double compute_s, comm_s;
	double wait_s;        /* devices sharing host cores waiting for each other (host_cores): in comm_s, or in
	                       * compute_s when the program has no collective */
	double dispatch_s;    /* of the step: the executor's time between kernels (dispatch_overhead) */
	double kind_s[OP_COUNT];
	int kind_n[OP_COUNT];
	double flops;                      /* per device */
	double axis_bytes[MESH_MAX_AXES];  /* bytes sent per device over each mesh axis */
	MemoryEstimate mem;
	int64_t phase_peak[PHASE_COUNT];   /* per phase, the most held just after one of its ops (0: no op) */
	bool fits;
} CostEstimate;

/* Estimate partitioned program g (local shapes, collectives) on hw. */
void cost_estimate(const Graph *g, const HwProfile *hw, CostEstimate *e);
/* The same for g as one step of a long run (s may be NULL: no carries,
 * every op forward). */
void cost_estimate_step(const Graph *g, const HwProfile *hw, const CostStep *s, CostEstimate *e);
/* The two-stream schedule of g over consecutive steps (schedule.c):
 * fills e's op start, end, hidden, wait, wait_on, delay and behind,
 * slots, overlapped_s, first_step_s and phase_hidden_s from the op
 * seconds and comm_s already in e. */
void cost_schedule(const Graph *g, const HwProfile *hw, const CostStep *s, CostEstimate *e);
/* The name of limit l on mesh m ("FLOPs", "memory bandwidth", "latency",
 * "host cores", "links of data") into buf. */
const char *cost_limit_name(const Mesh *m, int l, char *buf, size_t n);
/* The limit with the most seconds in lim[0..LIMIT_COUNT), or -1 when all are 0. */
int cost_limit_top(const double *lim);
void cost_estimate_free(CostEstimate *e);
/* cost_memory, and per phase (op[i].phase of each op) the most held just
 * after one of its ops, into phase_peak[PHASE_COUNT]: one walk. */
void cost_memory_phases(const Graph *g, const OpEstimate *op, MemoryEstimate *m, int64_t *phase_peak);
/* A lower bound on the compute stream's busy time per step (so on the
 * overlapped step time) of every partition of unpartitioned program g
 * over ndev devices: each op does at least 1/ndev of its work on a device,
 * and g's fusion groups are priced as kernels on that share (a partition
 * only splits them, with collectives and reshards between).  Reshapes are
 * free under fusion, as in cost_estimate. */
double cost_compute_bound(const Graph *g, const HwProfile *hw, int ndev);

#endif
