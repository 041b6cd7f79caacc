//! Where a cloud store's credentials come from. object_store, given none, asks the cloud's instance
//! metadata service (169.254.169.254) and retries for minutes; off a cloud VM that looks like a
//! hang. The warden asks a metadata service only when the user named it, and otherwise says at
//! once which variables to set.

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as Aws};
use object_store::azure::{AzureConfigKey as Az, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey as Gcs};

/// What to set when an S3 store names no credentials.
pub const S3_HINT: &str = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (in the environment or the --store-credentials file), \
or AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN (EKS IRSA), or AWS_CONTAINER_CREDENTIALS_FULL_URI with \
AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (EKS Pod Identity); to use this EC2 instance's role, set \
AWS_METADATA_ENDPOINT=http://169.254.169.254";

/// What to set when a GCS store names no credentials.
pub const GCS_HINT: &str = "set GOOGLE_SERVICE_ACCOUNT (a key file) or GOOGLE_APPLICATION_CREDENTIALS; to use this \
VM's or GKE workload's service account, set GCE_METADATA_HOST=metadata.google.internal";

/// What to set when an Azure store names no credentials.
pub const AZURE_HINT: &str = "set AZURE_STORAGE_ACCOUNT_KEY, or AZURE_STORAGE_SAS_KEY, or AZURE_CLIENT_ID with \
AZURE_TENANT_ID and AZURE_CLIENT_SECRET or AZURE_FEDERATED_TOKEN_FILE (AKS workload identity); to use this \
VM's managed identity, set AZURE_MSI_ENDPOINT=http://169.254.169.254/metadata/identity/oauth2/token";

fn set(v: Option<String>) -> bool {
    v.is_some_and(|v| !v.is_empty())
}

fn yes(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on"))
}

/// The AWS SDK's name for the metadata endpoint, honoured as object_store's own.
pub fn s3_metadata_endpoint(b: AmazonS3Builder) -> AmazonS3Builder {
    match std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT") {
        Ok(e) if !set(b.get_config_value(&Aws::MetadataEndpoint)) && !e.is_empty() => {
            b.with_config(Aws::MetadataEndpoint, e)
        }
        _ => b,
    }
}

/// Whether the S3 builder names a credential source (a half-given key pair counts: object_store
/// then names the missing half).
pub fn s3_named(b: &AmazonS3Builder) -> bool {
    let has = |k| set(b.get_config_value(&k));
    has(Aws::AccessKeyId)
        || has(Aws::SecretAccessKey)
        || (has(Aws::WebIdentityTokenFile) && has(Aws::RoleArn))
        || has(Aws::ContainerCredentialsRelativeUri)
        || has(Aws::ContainerCredentialsFullUri)
        || has(Aws::MetadataEndpoint)
        || yes(b.get_config_value(&Aws::SkipSignature))
}

/// Whether the GCS builder names a credential source; the gcloud default file counts.
pub fn gcs_named(b: &GoogleCloudStorageBuilder) -> bool {
    let has = |k| set(b.get_config_value(&k));
    let adc = std::env::var_os("HOME").is_some_and(|h| {
        std::path::Path::new(&h)
            .join(".config/gcloud/application_default_credentials.json")
            .is_file()
    });
    has(Gcs::ServiceAccount)
        || has(Gcs::ServiceAccountKey)
        || has(Gcs::ApplicationCredentials)
        || has(Gcs::BearerToken)
        || yes(b.get_config_value(&Gcs::SkipSignature))
        || adc
        || ["GCE_METADATA_HOST", "GCE_METADATA_ROOT", "GCE_METADATA_IP"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
}

/// Whether the Azure builder names a credential source.
pub fn azure_named(b: &MicrosoftAzureBuilder) -> bool {
    let has = |k| set(b.get_config_value(&k));
    has(Az::AccessKey)
        || has(Az::SasKey)
        || has(Az::Token)
        || (has(Az::ClientId) && (has(Az::ClientSecret) || has(Az::FederatedTokenFile)))
        || has(Az::MsiEndpoint)
        || yes(b.get_config_value(&Az::UseEmulator))
        || yes(b.get_config_value(&Az::UseAzureCli))
        || yes(b.get_config_value(&Az::SkipSignature))
}

/// `--store-credentials FILE`: `KEY=VALUE` lines with the same names as the environment variables
/// (AWS_ACCESS_KEY_ID, AZURE_STORAGE_ACCOUNT_KEY, GOOGLE_SERVICE_ACCOUNT_KEY, …), applied over the
/// environment. The backup loop re-reads the file when it changes, so rotated secrets need no restart.
pub fn read_credentials(path: &std::path::Path) -> Result<Vec<(String, String)>, super::StoreError> {
    use super::StoreError;
    let text = std::fs::read_to_string(path).map_err(|source| StoreError::Credentials {
        path: path.to_owned(),
        reason: source.to_string(),
    })?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            return Err(StoreError::Credentials {
                path: path.to_owned(),
                reason: format!("line {} is not KEY=VALUE", n + 1),
            });
        };
        let v = v.trim().trim_matches('"').trim_matches('\'').to_owned();
        out.push((k.trim().to_owned(), v));
    }
    Ok(out)
}
