# agentrun worker on every Nomad client: a system job with the raw_exec
# driver, which runs agentrun as the Nomad client's user (root) outside any
# isolation of Nomad's own, as agentrun needs: it makes its own cgroups,
# namespaces and mounts for each sandbox.
#
# Host requirements (each client): agentrun installed in /usr/local/bin
# (`make install`), Linux with cgroup v1 or v2 (memory, pids and cpu
# controllers), seccomp, overlay and tmpfs; `agentrun doctor` passes;
# /etc/agentrun/config.json with a "worker" section naming the NATS
# servers (and its creds/TLS files, root-only); the raw_exec plugin
# enabled in the client config:
#
#   plugin "raw_exec" { config { enabled = true } }
#
#   nomad job run packaging/nomad/agentrun-worker.nomad.hcl
job "agentrun-worker" {
  type = "system"

  group "worker" {
    task "worker" {
      driver = "raw_exec"

      config {
        command = "/usr/local/bin/agentrun"
        args    = ["worker", "--config", "/etc/agentrun/config.json"]
      }

      # On stop, agentrun stops taking tasks and lets the running ones
      # finish within the policy timeout (60s by default) plus 5s before it
      # kills them; give it that long before SIGKILL.
      kill_signal  = "SIGTERM"
      kill_timeout = "70s"

      # A worker that died is restarted; `agentrun worker` runs gc at start,
      # removing what the dead one left.
      restart {
        attempts = 10
        interval = "5m"
        delay    = "5s"
        mode     = "delay"
      }

      # What Nomad reserves for scheduling; the sandboxes' own limits come
      # from agentrun's config (worker.slots x policy limits).
      resources {
        cpu    = 500
        memory = 256
      }
    }
  }
}
