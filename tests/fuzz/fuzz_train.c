/* fuzz_train.c: differential, for training steps.  The input bytes choose a
 * small model with a train: section — a mesh of up to 3x3 devices (uneven
 * splits included), an input, a chain of up to 6 differentiable ops with
 * params (einsum weights, biases) and random shardings, a mean-squared
 * loss — and the training settings: the optimizer, weight-update sharding
 * (off, on, auto; per param too), all_gather (the section's and each
 * param's own), prefetch, group_bytes, global-norm clipping and recompute
 * (true or selective).  Two steps run partitioned on threads, one per
 * device, and on the reference executor, compared as `spmd run --check`
 * compares them (the loss, the params, the optimizer state, the
 * gradients).  A mismatch, or a model
 * that builds but fails to partition or run, is a finding. */
#include "fuzz.h"

#include "../../spmd/load.h"
#include "../../cli/cmd_train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FuzzBytes b = {data, size};
	const char *model = fuzz_train_model(&b);
	Graph g;
	Diag d;
	fuzz_diag(&d);
	if (model_load_string(&g, model, "train_diff.yaml", &d) != 0)
		FUZZ_FINDING("a generated model does not load: %s\n%s", d.last, model);
	TrainCmd o = {.steps = "2", .check = true, .seed = 7};
	int rc = cmd_run_train(&g, &o, &d);
	fflush(stdout); /* the check's lines, before an abort */
	if (rc == 1)
		FUZZ_FINDING("the partitioned training steps differ from the reference: %s\n%s", d.last, model);
	if (rc != 0)
		FUZZ_FINDING("the training steps fail: %s\n%s", d.last, model);
	graph_free(&g);
	return 0;
}
