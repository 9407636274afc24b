#include "app/cli_main.h"

int main(int argc, char** argv) { return fsdpq::cli_main(argc, argv); }
