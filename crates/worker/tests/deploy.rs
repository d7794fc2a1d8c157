//! The job config shipped in the Kubernetes manifests stays a valid job config.

use sparta_worker::JobConfig;

#[test]
fn the_k8s_configmap_job_config_is_valid() {
    let yaml = include_str!("../../../deploy/k8s/base/configmap.yaml");
    let start = yaml.find("job.toml: |").expect("a job.toml entry") + "job.toml: |".len();
    // The block scalar: every following line indented by 4 spaces (or blank).
    let toml: String = yaml[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| l.strip_prefix("    ").unwrap_or(l).to_string() + "\n")
        .collect();
    let job = JobConfig::from_toml(&toml)
        .and_then(|c| c.validate())
        .unwrap_or_else(|e| panic!("{e}\n{toml}"));
    assert_eq!(
        job.raw.train.checkpoint_dir.as_deref(),
        Some(std::path::Path::new("/data/ckpt"))
    );
    assert!(job.raw.train.checkpoint_every_steps > 0);
}
