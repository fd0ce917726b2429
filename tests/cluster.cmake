# A cluster on one machine (tests/test_cluster.py): every lab's --dry-run against
# a real run of the same flags, and the per-host lines and lab06's placement
# warnings on hosts that tests/fake_hosts.c pretends (its library is built in
# lab06.cmake).
# cluster_hydra: hosts placed by MPICH's own launcher (hydra's fork launcher, one
# proxy per host name, all on this machine); skipped where mpiexec is not hydra
foreach(case dry_run hosts hydra)
  add_lab_test(cluster_${case} test_cluster.py ${case})
endforeach()
set_tests_properties(cluster_hydra PROPERTIES SKIP_RETURN_CODE 77)
if(TARGET lab06_fake_hosts)
  set_property(TEST cluster_hosts APPEND PROPERTY ENVIRONMENT "FAKE_HOSTS_LIB=$<TARGET_FILE:lab06_fake_hosts>")
endif()
