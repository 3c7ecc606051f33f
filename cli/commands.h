/* commands.h: the subcommands of the spmd tool; each returns the exit status. */
#ifndef SPMD_COMMANDS_H
#define SPMD_COMMANDS_H

int cmd_check(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_reshard(int argc, char **argv);
int cmd_propagate(int argc, char **argv);
int cmd_partition(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_cost(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_explore(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_autoshard(int argc, char **argv);

#endif
