// The trafficrate CLI; see tools/cli.h.

#include "tools/cli.h"

int main(int argc, char** argv) { return trafficrate::CliMain(argc, argv); }
