// main.c as C++: the installed headers must compile there, and gcomp_mpi.h must keep Open MPI's
// deprecated C++ bindings (whose library gcomp's targets do not link) out of the program.
#include "main.c"
