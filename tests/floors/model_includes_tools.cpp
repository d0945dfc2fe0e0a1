// Compiled with the view of the tree that the model's targets get (cmake/kvoffload_floors.cmake):
// a file of model/ that includes a header of tools/, a higher floor, must not compile.
#include "tools/cli/cli.hpp"
