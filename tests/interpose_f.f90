! interpose_f.f90 -- a Fortran `use mpi` program (built with -cpp -DGCOMP_F08: `use mpi_f08`)
! that knows nothing of gcomp, run by interpose.sh under LD_PRELOAD=libgcomp_mpi.so. Open
! MPI's Fortran MPI_ALLREDUCE goes to PMPI_Allreduce directly, past the C MPI_Allreduce; the
! interposer replaces the Fortran entry points too, so a large MPI_REAL sum is compressed (in
! place too) and the rest passes through. References come from the program's own
! PMPI_ALLREDUCE, which must pass through untouched: interpose.sh's count of compressed calls
! would catch one that did not (in both bindings PMPI_ALLREDUCE and MPI_ALLREDUCE share Open
! MPI's body, ompi_allreduce_f).
! usage: interpose_f exact|lossy  (lossy: GCOMP_CODEC is set)
program interpose_f
#ifdef GCOMP_F08
  use mpi_f08
#else
  use mpi
#endif
  implicit none
  integer, parameter :: n = 40000, nsmall = 1000
  real, allocatable :: x(:), got(:), ref(:)
  double precision, allocatable :: dx(:), dgot(:), dref(:)
  integer :: rank, nranks, ierr, i, failures, total, ncomp, npass, nfreed
#ifdef GCOMP_F08
  type(MPI_Comm) :: dup
#else
  integer :: dup
#endif
  character(len=16) :: mode
  logical :: lossy

  call get_command_argument(1, mode)
  lossy = trim(mode) == 'lossy'
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  allocate(x(n), got(n), ref(n), dx(n), dgot(n), dref(n))
  do i = 1, n
    x(i) = sin(0.37 * i + 1.3 * rank) * (1 + mod(i, 7))
    dx(i) = x(i)
  end do
  failures = 0
  ncomp = 0
  npass = 0

  ! a large real sum: compressed when lossy
  call PMPI_Allreduce(x, ref, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call MPI_Allreduce(x, got, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check_real('real sum', lossy)
  ! the same in place
  got = x
  call MPI_Allreduce(MPI_IN_PLACE, got, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check_real('in-place real sum', lossy)
  if (lossy) then
    ncomp = ncomp + 2
  else
    npass = npass + 2
  end if

  ! pass-through: a small buffer, MPI_MAX, double precision
  call PMPI_Allreduce(x, ref, nsmall, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call MPI_Allreduce(x, got, nsmall, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (any(got(1:nsmall) /= ref(1:nsmall))) call fail('small real sum differs from PMPI_Allreduce')
  call PMPI_Allreduce(x, ref, n, MPI_REAL, MPI_MAX, MPI_COMM_WORLD, ierr)
  call MPI_Allreduce(x, got, n, MPI_REAL, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (any(got /= ref)) call fail('real max differs from PMPI_Allreduce')
  call PMPI_Allreduce(dx, dref, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call MPI_Allreduce(dx, dgot, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (any(dgot /= dref)) call fail('double precision sum differs from PMPI_Allreduce')
  npass = npass + 3

  ! a duplicate of the world, freed with MPI_COMM_FREE (whose entry points the interposer
  ! replaces too): its gcomp communicator, if it got one, goes with it
  call MPI_Comm_dup(MPI_COMM_WORLD, dup, ierr)
  call PMPI_Allreduce(x, ref, n, MPI_REAL, MPI_SUM, dup, ierr)
  call MPI_Allreduce(x, got, n, MPI_REAL, MPI_SUM, dup, ierr)
  call check_real('real sum on a duplicate', lossy)
  call MPI_Comm_free(dup, ierr)
  if (ierr /= MPI_SUCCESS) call fail('MPI_Comm_free of the duplicate')
  nfreed = 0
  if (lossy) then
    ncomp = ncomp + 1
    nfreed = 1
  else
    npass = npass + 1
  end if

  print '(a,i0,a,i0,a,i0,a,i0)', 'rank ', rank, ' expects compressed=', ncomp, ' passed=', npass, &
    ' no_ef=0 freed=', nfreed
  call PMPI_Allreduce(failures, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a,l1,a,i0)', 'interpose_f lossy=', lossy, ' failures=', total
  call MPI_Finalize(ierr)
  if (total /= 0) stop 1

contains

  subroutine fail(msg)
    character(len=*), intent(in) :: msg
    print '(a,i0,a,a)', 'rank ', rank, ': FAIL ', msg
    failures = failures + 1
  end subroutine fail

  ! lossy: differs from MPI's sum (compressed) but within a loose bound; else bit-exact
  subroutine check_real(what, compressed)
    character(len=*), intent(in) :: what
    logical, intent(in) :: compressed
    if (compressed) then
      if (all(got == ref)) call fail(what // ': identical to PMPI_Allreduce, not compressed')
      if (maxval(abs(got - ref)) > 2.0 * nranks * 7.0) call fail(what // ': error beyond the codec bound')
    else
      if (any(got /= ref)) call fail(what // ': differs from PMPI_Allreduce')
    end if
  end subroutine check_real
end program interpose_f
