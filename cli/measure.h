/* measure.h: preparing a model's program for the cost model, and timing real
 * runs of it on the thread backend (calibration, --compare-run).  These run
 * programs, so they live with the commands, above every other layer.
 *
 *   Graph model, prog;
 *   if (cost_prepare("mlp.yaml", NULL, -1, &model, &prog, &d) == 0)
 *           cost_measure(&model, &prog, 3, sec, &d);   // sec: prog.ops.n entries
 *   graph_free(&prog), graph_free(&model);
 */
#ifndef SPMD_MEASURE_H
#define SPMD_MEASURE_H

#include "../cost_model/cost.h"
#include "../partitioner/wus.h"
#include "../spmd/load.h"

/* Load model path (mesh: a --mesh text or NULL), build its training step
 * when it has a train: section (wus: a WusMode for its
 * weight_update_sharding, or -1 for the model's own), propagate and
 * partition it into prog (partitioner/pipeline.h); a partitioned program
 * (`spmd: true`) is taken as it is (model then stays empty).  Both graphs
 * are initialised here; free them whatever the result.  0, or -1 after
 * reporting. */
int cost_prepare(const char *path, const char *mesh, int wus, Graph *model, Graph *prog, Diag *d);
/* cost_prepare, and the program as one step of a long run into *step (its
 * phases and carried values, partitioner/step.h; free with cost_step_free;
 * a loaded program gets none).  step may be NULL. */
int cost_prepare_step(const char *path, const char *mesh, int wus, Graph *model, Graph *prog, CostStep *step,
                      Diag *d);
/* The same with the options of --mesh and --axis-rules (o may be NULL);
 * passes (or NULL) gets what the passes did: weight-update sharding, the
 * collective matmuls and where the step's reductions and updates were put
 * (partitioner/wus.h; left as it was for a program loaded as it is);
 * floor (or NULL) the model's memory floor on its devices
 * (cost_step_floor, of the model as built; -1 for a pipelined model or a
 * program loaded as it is). */
int cost_prepare_opts(const char *path, const LoadOpts *o, int wus, Graph *model, Graph *prog, CostStep *step,
                      WusReport *passes, int64_t *floor, Diag *d);
/* Per value of prog, the id range of its i32 leaves: that of model's value
 * of the same name (SpmdOpts.id_range).  Free it. */
int64_t *cost_leaf_ranges(const Graph *model, const Graph *prog);
/* One timed run of a program on the thread backend. */
typedef struct {
	int ndev, nops;
	double *sec;   /* ndev * nops, device-major: every op's seconds on every device */
	double *at;    /* ndev * nops, the same way: when each op began (0: the device does not run it) */
	double *start; /* per device: when it began its first op, after every device made its data */
	double *end;   /* per device: when it finished its last op */
	double step;   /* the step's wall-clock time: the last end less the first start */
	int64_t *peak; /* per device: the most bytes its tensor buffers held at once (tensor_mem_peak: 4 bytes an
	                * element, leaves included) */
} CostRun;

/* Run prog (from model; model may be empty when prog was loaded as a
 * program) on the thread backend `runs` times and keep in *r the run whose
 * step was shortest (other load on the machine only adds).  BLAS runs on
 * one thread inside each device thread, as spmd calibrate measures it.
 * r is allocated here; free it with cost_run_free whatever the result.  0,
 * or -1 after reporting. */
int cost_run(const Graph *model, const Graph *prog, int runs, CostRun *r, Diag *d);
void cost_run_free(CostRun *r);
/* Per op (prog->ops.n entries of sec), the seconds of the device that
 * finished last: its op's own time, its time between kernels spread evenly
 * over its ops, and the time it waited for the cores before its first op
 * added to its first collective (its first op when it has none).  They sum
 * to r->step. */
void cost_run_attribute(const Graph *prog, const CostRun *r, double *sec);
/* cost_run, then cost_run_attribute into sec. */
int cost_measure(const Graph *model, const Graph *prog, int runs, double *sec, Diag *d);

/* A pipelined model's program as spmd run builds it (partitioner/pipe_program.h),
 * for --compare-run: load path again, build its step and partition it
 * with the stages of cut (stages: auto: the cut cost_pipeline balanced;
 * NULL: the model's own).  0, or -1 after reporting. */
int cost_prepare_pipelined(const char *path, const LoadOpts *o, const struct Pipeline *cut, Graph *model,
                           Graph *prog, Diag *d);

/* stages: auto in g (loaded from path with o): the cut `spmd cost` makes
 * (cost_model/pipeline_cost.h, on g's mesh hardware), so that the
 * pipelined program runs the stages that were priced.  Loads the model a
 * second time: the pricing partitions it with the stage axis replicated,
 * which g must not go through.  Nothing for other models.  0, or -1 after
 * reporting. */
int cost_pipeline_cut(Graph *g, const char *path, const LoadOpts *o, Diag *d);

/* A timed run of a pipelined program, by microbatch step (Op.pipe_step).
 * The microbatch steps span `makespan`: from the first device's first
 * step op to the last device's last.  A device is idle in that span before
 * its first step op, after its last, and inside its sends (a send on
 * threads waits for its other end); busy the rest — its ops and the
 * executor's time between them.  The bubble is the idle share of every
 * device's span, as the cost model's (cost_model/pipeline_cost.h). */
typedef struct {
	int ndev;
	double makespan, bubble_fraction;
	double *busy, *idle;  /* per device */
	double *first, *last; /* per device: its first step op's start, its last one's end */
	int *steps;           /* per device: the microbatch steps it ran (2 m V) */
} PipeMeasured;

void cost_run_pipeline(const Graph *prog, const CostRun *r, PipeMeasured *pm);
void pipe_measured_free(PipeMeasured *pm);

#endif
