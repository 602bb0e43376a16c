"""The watchdog's rules: which Pods wait for an image their kubelet cannot get (pull_failures),
when that wait is due (stalls), and what is written to fail the Job (job_failure)."""
